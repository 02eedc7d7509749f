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
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from baton.config import load_config
from baton.data.prepare import prepare
from baton.errors import DataError
from support.kills import kill_when
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
    files["data/small.jsonl"] = gzip.decompress(jsonl_gz_bytes(DOCS[-30:-25]))  # text: a plain git file, not LFS
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


def config(path: Path, data_dir: Path, source: str, tokenizer: str = "", data: str = "shard_tokens = 1500\n") -> Path:
    path.write_text(f'[data]\ndir = "{data_dir}"\ntokenizer = {json.dumps(tokenizer)}\ntokenizer_vocab = 512\n'
                    f'seq_len = 32\nval_windows = 4\n{data}\n{source}')
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

    # Gzipped JSONL (LFS) and plain JSONL (a git file, checked by its git oid), the tokenizer trained on the
    # source itself (read through the Hub twice).
    m_jsonl = prepare(load_config(config(tmp_path / "c.toml", tmp_path / "c", hub_source(repo, "data/*.jsonl*"))),
                      progress=False)
    prepare(load_config(config(tmp_path / "d.toml", tmp_path / "d",
                               f'[[data.sources]]\nkind = "jsonl"\npath = "{local}/data/*.jsonl*"\n')),
            progress=False)
    assert folder_bytes(tmp_path / "c") == folder_bytes(tmp_path / "d")
    assert [(f["path"], f["sha256"] is None) for f in m_jsonl["sources"][0]["hub"]["files"]] == [
        ("data/extra.jsonl.gz", False), ("data/small.jsonl", True)]

    # A second prepare of the same config is a no-op: no file is fetched again (the cache holds them).
    before = len(hub.requests)
    again = prepare(load_config(tmp_path / "a.toml"), progress=False)
    assert again["fingerprint"] == m_hub["fingerprint"]
    assert not [p for _, p in hub.requests[before:] if "/resolve/" in p or "/lfs-blob/" in p]


def _fails(tmp_path: Path, name: str, source: str, tokenizer: str) -> str:
    out = tmp_path / name
    with pytest.raises(DataError) as e:
        prepare(load_config(config(tmp_path / f"{name}.toml", out, source, tokenizer)), progress=False)
    assert not (out / "manifest.json").exists()
    return str(e.value)


def test_a_bad_token_a_missing_repository_revision_column_or_file_is_one_line(hub, tmp_path, monkeypatch,
                                                                               tokenizer_file):
    files = corpus_files(n_files=2)
    repo, commit = new_repo(hub, files)
    tok = str(tokenizer_file)
    what = f"data source 0 (hub {repo}@main)"

    bad = "hf_" + "x" * 30
    monkeypatch.setenv("HF_TOKEN", bad)
    msg = _fails(tmp_path, "token", hub_source(repo, "data/*.parquet"), tok)
    assert msg == (f"{what}: the Hub refused access to {repo} (HTTP 401): for a private or gated repository set "
                   "HF_TOKEN to a token that may read it (a wrong or expired token gets this too)")
    monkeypatch.setenv("HF_TOKEN", hub.token)

    hub.gated.add(f"datasets/{repo}")  # terms not accepted: the Hub's 403
    try:
        assert _fails(tmp_path, "gated", hub_source(repo, "data/*.parquet"), tok) == (
            f"{what}: the token may not read {repo} (HTTP 403): accept the repository's terms on the Hub if it is "
            "gated, and set HF_TOKEN to a token with read access")
    finally:
        hub.gated.discard(f"datasets/{repo}")
    assert _fails(tmp_path, "repo", hub_source("baton-test/no-such-corpus", "*.parquet"), tok) == (
        "data source 0 (hub baton-test/no-such-corpus@main): Hub repository baton-test/no-such-corpus was not found "
        "(HTTP 404): check the name (owner/name) and whether it is a dataset or a model repository")
    assert _fails(tmp_path, "rev", hub_source(repo, "data/*.parquet", 'revision = "v9"\n'), tok) == (
        f"data source 0 (hub {repo}@v9): revision 'v9' does not exist in {repo} (name one of its branches, tags "
        "or commits)")
    assert _fails(tmp_path, "glob", hub_source(repo, "data/*.csv"), tok) == (
        f"{what}: no Parquet or JSONL file of {repo} at {commit[:12]} matches files = 'data/*.csv' (the repository "
        "holds README.md, data/extra.jsonl.gz, data/small.jsonl, data/train-00000.parquet, data/train-00001.parquet"
        "); fix the glob")
    assert _fails(tmp_path, "column", hub_source(repo, "data/*.parquet", 'field = "body"\n'), tok) == (
        f"{repo}/data/train-00000.parquet@{commit[:12]} has no column 'body' (columns: id, text, lang); "
        "set field = \"...\" on the source")
    assert _fails(tmp_path, "tokenizer", hub_source(repo, "data/*.parquet"), "hf://baton-test/no-such-tok") == (
        "data.tokenizer hf://baton-test/no-such-tok: Hub repository baton-test/no-such-tok was not found (HTTP 404): "
        "check the name (owner/name) and whether it is a dataset or a model repository")


@pytest.mark.parametrize("stream", [False, True])
def test_a_missing_text_field_is_refused_before_anything_is_written_or_downloaded(hub, tmp_path, tokenizer_file,
                                                                                  stream):
    """As a missing repository or revision is: one line, and no data folder, no download (ranged reads of the
    first file's footer or first line only)."""
    files = corpus_files(n_files=2)
    repo, commit = new_repo(hub, files)
    extra = 'field = "body"\n' + ("stream = true\n" if stream else "")
    for glob, said in [("data/*.parquet", f"{repo}/data/train-00000.parquet@{commit[:12]} has no column 'body' "
                                          "(columns: id, text, lang); set field = \"...\" on the source"),
                       ("data/*.jsonl.gz", f"{repo}/data/extra.jsonl.gz@{commit[:12]}:1 has no field 'body' (set "
                                           "field = \"...\" on the source)"),
                       ("data/small.jsonl", f"{repo}/data/small.jsonl@{commit[:12]}:1 has no field 'body' (set "
                                            "field = \"...\" on the source)")]:
        name = glob.replace("/", "-").replace("*", "all")
        mark = len(hub.requests)
        assert _fails(tmp_path, name, hub_source(repo, glob, extra), str(tokenizer_file)) == said
        assert not (tmp_path / name).exists()
        assert not (tmp_path / "hf-cache").exists() or not list((tmp_path / "hf-cache").rglob("*.parquet")) + list(
            (tmp_path / "hf-cache").rglob("*.jsonl*"))
        assert len([p for _, p in hub.requests[mark:] if "/resolve/" in p or "/lfs-blob/" in p]) <= 4


def test_a_file_whose_bytes_do_not_match_the_listing_is_refused_before_a_row_is_read(hub, tmp_path, tokenizer_file):
    files = corpus_files(n_files=3)
    repo, commit = new_repo(hub, files)
    name = "data/train-00001.parquet"
    hub.corrupt(f"datasets/{repo}", name, 200, rehash=False)  # the listing keeps the sha256 of the true bytes
    damaged = bytearray(files[name])
    damaged[200] ^= 0xFF
    msg = _fails(tmp_path, "tampered", hub_source(repo, "data/*.parquet"), str(tokenizer_file))
    assert msg == (
        f"data source 0 (hub {repo}@main): {repo}/{name}@{commit[:12]} does not match the Hub's listing "
        f"({len(damaged):,} bytes hashing to {hashlib.sha256(damaged).hexdigest()}, listed {len(damaged):,} bytes and "
        f"{hashlib.sha256(files[name]).hexdigest()}); the copy was deleted: rerun `baton prepare` to fetch it again, "
        "and report it to the repository's owner if it persists")
    cached = [p for p in (tmp_path / "hf-cache").rglob("*") if p.is_file() and p.read_bytes() == bytes(damaged)]
    assert cached == []
    # Nothing of the damaged file reached a shard: the shards written (whole, under their names) hold no more
    # tokens than the first file's documents make.
    from tokenizers import Tokenizer

    from baton.data.shards import read_header

    tok = Tokenizer.from_file(str(tokenizer_file))
    first_file = sum(len(tok.encode(d, add_special_tokens=False).ids) + 1 for d in DOCS[:20])
    written = [read_header(p)[1] for p in sorted((tmp_path / "tampered").glob("shard-*.bin"))]
    assert sum(written) <= first_file


def test_a_branch_that_moved_is_said_with_what_changed(hub, tmp_path, tokenizer_file):
    files = corpus_files(n_files=2)
    repo, first = new_repo(hub, files)
    cfg = config(tmp_path / "m.toml", tmp_path / "m", hub_source(repo, "data/*.parquet"), str(tokenizer_file))
    m = prepare(load_config(cfg), progress=False)
    shard = tmp_path / "m" / "shard-00000.bin"
    stamp = shard.stat().st_mtime_ns

    # A commit that touches none of the selected files: the prepared data still stands.
    readme = hub.put(f"datasets/{repo}", {"README.md": b"---\nlicense: mit\n---\n# edited\n"})
    assert prepare(load_config(cfg), progress=False)["fingerprint"] == m["fingerprint"]

    moved = hub.put(f"datasets/{repo}", {"data/train-00001.parquet": parquet_bytes(DOCS[50:60], 50),
                                         "data/train-00002.parquet": parquet_bytes(DOCS[60:70], 60)})
    with pytest.raises(DataError) as e:
        prepare(load_config(cfg), progress=False)
    assert str(e.value) == (
        f"data source 0 (hub {repo}): revision 'main' moved from {first[:12]} to {moved[:12]} since {tmp_path / 'm'} "
        "was prepared (changed data/train-00001.parquet; added data/train-00002.parquet): set revision = "
        f"\"{first}\" to keep the prepared data, or rerun `baton prepare --force` to prepare the new commit")
    assert readme != first

    # Pinned to the commit it was prepared from: the folder is used as it is, nothing written again.
    pinned = config(tmp_path / "p.toml", tmp_path / "m", hub_source(repo, "data/*.parquet", f'revision = "{first}"\n'),
                    str(tokenizer_file))
    assert prepare(load_config(pinned), progress=False)["fingerprint"] == m["fingerprint"]
    assert shard.stat().st_mtime_ns == stamp
    # --force prepares the new commit and records it.
    new = prepare(load_config(cfg), force=True, progress=False)
    assert new["sources"][0]["hub"]["commit"] == moved and new["fingerprint"] != m["fingerprint"]

    # An unfinished prepare (a journal, no manifest yet) is held to its commit the same way.
    from baton.data.journal import Journal

    (tmp_path / "m" / "manifest.json").unlink()
    Journal(tmp_path / "m").write({"spec": "unfinished", "tokenizer_sha256": "", "hub": [new["sources"][0]["hub"]]})
    third = hub.put(f"datasets/{repo}", {"data/train-00000.parquet": parquet_bytes(DOCS[70:80], 70)})
    with pytest.raises(DataError, match=f"moved from {moved[:12]} to {third[:12]} .*changed data/train-00000.parquet"):
        prepare(load_config(cfg), progress=False)


def test_the_cli_says_a_refused_token_in_one_line_without_printing_it(hub, tmp_path, monkeypatch, capsys,
                                                                      tokenizer_file):
    from baton.cli import main

    repo, _ = new_repo(hub, corpus_files(n_files=1))
    cfg = config(tmp_path / "c.toml", tmp_path / "c", hub_source(repo, "data/*.parquet"), str(tokenizer_file))
    bad = "hf_" + uuid.uuid4().hex
    monkeypatch.setenv("HF_TOKEN", bad)
    assert main(["prepare", "-c", str(cfg), "--no-progress"]) == 2
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert lines == [f"baton: error: data source 0 (hub {repo}@main): the Hub refused access to {repo} (HTTP 401): "
                     "for a private or gated repository set HF_TOKEN to a token that may read it (a wrong or expired "
                     "token gets this too)"]
    assert bad not in out.err + out.out and hub.token not in out.err + out.out


# ------------------------------------------------------------------------------- streaming, killed twice

def stdlib_lines(count: int) -> list[str]:
    """Short real documents (source lines): a file of a thousand is many encode batches, so a prepare reads
    its files one after another as it writes shards, as it does on a real corpus of large files."""
    from baton.data.sources import stdlib_files

    out: list[str] = []
    for f in stdlib_files():
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            if 30 <= len(line.strip()) <= 100:
                out.append(line.strip())
                if len(out) == count:
                    return out
    return out


def _journal_file(journal: Path) -> int:
    """The source file the last complete journal record continues from (-1 before the first)."""
    try:
        lines = journal.read_bytes().split(b"\n")
    except FileNotFoundError:
        return -1
    fi = -1
    for line in lines[1:]:
        try:
            rec = json.loads(line)
        except ValueError:
            break
        if "resume" in rec:
            fi = rec["resume"]["mix"]["streams"][0][1][0]
    return fi


def _downloads(hub, since: int, oids: dict[str, int]) -> list[int]:
    """Which files (by index) were fetched in the requests after ``since``."""
    return [oids[p.rsplit("/", 1)[1]] for m, p in hub.requests[since:] if m == "GET" and p.startswith("/lfs-blob/")
            and p.rsplit("/", 1)[1] in oids]


def _on_disk(folder: Path) -> int:
    """Source files (whole or partly downloaded) a streaming prepare holds."""
    return len([p for p in folder.rglob("*") if p.is_file() and (p.name.endswith(".parquet")
                                                                  or p.name.endswith(".incomplete"))])


def test_a_streaming_prepare_killed_mid_tokenize_and_mid_download_continues_to_the_same_bytes(hub, tmp_path,
                                                                                              tokenizer_file):
    import os
    import subprocess
    import sys

    lines = stdlib_lines(8 * 800)
    files = {f"data/part-{k:03d}.parquet": parquet_bytes(lines[k * 800:(k + 1) * 800], k * 800) for k in range(8)}
    repo, _ = new_repo(hub, files)
    oids = {hashlib.sha256(data).hexdigest(): i for i, data in enumerate(files.values())}
    local = write_local(tmp_path / "local", files)
    data = "shard_tokens = 6000\nprepare_workers = 1\n"
    prepare(load_config(config(tmp_path / "ref.toml", tmp_path / "ref",
                               f'[[data.sources]]\nkind = "parquet"\npath = "{local}/data/*.parquet"\n',
                               str(tokenizer_file), data)), progress=False)

    out = tmp_path / "cut"
    cfg = config(tmp_path / "cut.toml", out, hub_source(repo, "data/*.parquet", "stream = true\nprefetch = 1\n"),
                 str(tokenizer_file), data)
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": hub.token, "HF_HUB_DISABLE_XET": "1",
           "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "baton.cli", "prepare", "-c", str(cfg), "--no-progress"]
    root = Path(__file__).resolve().parents[2]
    streaming = out / ".hub-files"
    journal = out / "prepare.journal"

    def run_until(done) -> int:
        """Start a prepare, SIGKILL it once ``done()``; the file its journal continues from."""
        kill_when(cmd, done, root, env)
        assert _on_disk(streaming) <= 2 + 1  # the file being read, the one fetched ahead (+ one cut short)
        return _journal_file(journal)

    # 1. Mid-tokenize: once the shards written cover the first two files.
    first = run_until(lambda: _journal_file(journal) >= 2)
    mark = len(hub.requests)
    # 2. Mid-download: the sixth file's download sends half its bytes, then hangs until the kill.
    stalled = list(files)[5]
    release = hub.stall(f"datasets/{repo}", stalled, len(files[stalled]) // 2)
    blob = hashlib.sha256(files[stalled]).hexdigest()
    second = run_until(lambda: ("GET", f"/lfs-blob/{blob}") in hub.requests[mark:])
    release.set()
    assert first >= 2 and second >= first
    assert min(_downloads(hub, mark, oids)) >= first  # finished files are not fetched again
    mark2 = len(hub.requests)

    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"continuing an interrupted prepare in {out}" in done.stderr
    assert min(_downloads(hub, mark2, oids)) >= second
    assert not streaming.exists() and not journal.exists()
    assert folder_bytes(out) == folder_bytes(tmp_path / "ref")
    m = json.loads((out / "manifest.json").read_text())
    assert [f["sha256"] for f in m["sources"][0]["hub"]["files"]] == list(oids)


@pytest.mark.parametrize(("toml", "message"), [
    ('[data]\ntokenizer = "hf://just-a-name"\n[[data.sources]]\nkind = "hub"\npath = "x"\nprefetch = -1\n'
     '[[data.sources]]\nkind = "jsonl"\npath = "x.jsonl"\nrepo = "a/b"\n',
     "invalid config (6 problems):\n"
     "  - data.sources[0].prefetch must be >= 0, got -1\n"
     "  - data.sources[0] (hub) needs repo = \"owner/name\" (a Hub dataset repository), got ''\n"
     "  - data.sources[0] (hub) needs files = \"...\", a glob of the repository's files (e.g. \"data/*.parquet\"), "
     "or config = \"...\", a config its README.md declares\n"
     "  - data.sources[0] (hub) takes repo and files, not path (path names local files)\n"
     "  - data.sources[1] (jsonl) reads local files: repo, files, config and split are for kind = \"hub\"\n"
     "  - data.tokenizer='hf://just-a-name' must name a Hub repository as hf://owner/name or "
     "hf://owner/name@revision"),
    ('[[data.sources]]\nkind = "hub"\nrepo = "a/b"\nfiles = "*.parquet"\nconfig = "c"\n'
     '[[data.sources]]\nkind = "hub"\nrepo = "a/b"\nfiles = "*.parquet"\nsplit = "test"\n',
     "invalid config (2 problems):\n"
     "  - data.sources[0] (hub) takes files or config, not both (files: a glob of the repository's files; config: "
     "one its README.md declares)\n"
     "  - data.sources[1].split = 'test' selects a split of a config: set config too (with files, the glob alone "
     "selects)"),
], ids=["fields", "files-and-config"])
def test_hub_fields_and_tokenizers_are_checked_where_the_config_is_read(tmp_path, toml, message):
    from baton.errors import ConfigError

    bad = tmp_path / "bad.toml"
    bad.write_text(toml)
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert str(e.value) == message


def test_the_fineweb_reference_recipe_validates_and_caps_at_1_1b_tokens():
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "ref-106m-fineweb.toml")
    (src,) = cfg.data.sources
    assert (src.kind, src.repo, src.files, src.stream) == ("hub", "HuggingFaceFW/fineweb-edu",
                                                           "sample/10BT/*.parquet", True)
    assert cfg.data.tokenizer == "hf://HuggingFaceTB/SmolLM-135M" and cfg.model.vocab_size == 49152
    trained = cfg.total_steps * cfg.tokens_per_step
    assert trained <= src.max_tokens == 1_100_000_000 and trained > 0.9e9


def test_a_capped_streaming_source_fetches_only_the_first_files_and_leaves_none(hub, tmp_path, tokenizer_file):
    lines = stdlib_lines(6 * 800)
    files = {f"data/part-{k:03d}.parquet": parquet_bytes(lines[k * 800:(k + 1) * 800], k * 800) for k in range(6)}
    repo, _ = new_repo(hub, files)
    oids = {hashlib.sha256(data).hexdigest(): i for i, data in enumerate(files.values())}
    mark = len(hub.requests)
    m = prepare(load_config(config(tmp_path / "cap.toml", tmp_path / "cap",
                                   hub_source(repo, "data/*.parquet", "stream = true\nprefetch = 1\nmax_tokens = 5000\n"),
                                   str(tokenizer_file), "shard_tokens = 2000\nprepare_workers = 1\n")), progress=False)
    assert m["sources"][0]["tokens"] == m["total_tokens"] == 5000
    fetched = sorted(set(_downloads(hub, mark, oids)))
    assert fetched == list(range(len(fetched))) and 1 <= len(fetched) <= 3  # the first files, one fetched ahead
    assert not (tmp_path / "cap" / ".hub-files").exists()


def test_a_resume_on_data_prepared_from_a_moved_branch_names_the_source_and_both_commits(hub, tmp_path, tokenizer_file,
                                                                                         baton_cli, monkeypatch):
    from support.helpers import write_config

    files = corpus_files(n_files=2)
    repo, first = new_repo(hub, files)
    cfg = write_config(tmp_path / "run.toml", tmp_path / "data", tmp_path / "store", tmp_path / "runs")
    text = cfg.read_text()
    stdlib = '[[data.sources]]\nkind = "stdlib"\nmax_bytes = 400000\n'
    assert stdlib in text
    cfg.write_text(text.replace(stdlib, hub_source(repo, "data/*.parquet")).replace(
        "tokenizer_vocab = 512\n", f"tokenizer_vocab = 512\ntokenizer = {json.dumps(str(tokenizer_file))}\n"))
    m = prepare(load_config(cfg), progress=False)

    def train(*args: str):
        # Training reads the prepared folder only: no Hub endpoint, so the pre-imported CLI process serves it.
        with monkeypatch.context() as env:
            env.delenv("HF_ENDPOINT")
            env.delenv("HF_TOKEN")
            return baton_cli("train", "-c", str(cfg), "--no-progress", *args)

    r = train("--stop-after-steps", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    pointer = json.loads((tmp_path / "store" / "test" / "latest.json").read_text())
    state = json.loads((tmp_path / "store" / "test" / pointer["path"] / "state.json").read_text())
    assert state["data"]["hub"] == [f"{repo}@{first}"]

    moved = hub.put(f"datasets/{repo}", {"data/train-00001.parquet": parquet_bytes(DOCS[50:60], 50)})
    new = prepare(load_config(cfg), force=True, progress=False)
    assert new["fingerprint"] != m["fingerprint"]
    r = train()
    errors = [line for line in r.stderr.splitlines() if line.startswith("baton: error:")]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert (f"data.fingerprint: checkpoint '{m['fingerprint']}', now '{new['fingerprint']}' (data source 0, hub "
            f"{repo}: commit {first} -> {moved}; revision = \"{first}\" and `baton prepare --force` restore the "
            "checkpoint's data)") in errors[0]


CARD = b"""---
license: mit
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*.parquet
  - split: test
    path: [data/small.jsonl]
- config_name: extra
  data_files: data/extra.jsonl.gz
---
# a corpus with two configs
"""


def test_a_config_and_split_select_the_files_the_readme_declares_at_the_pinned_commit(hub, tmp_path, tokenizer_file):
    from baton.data.hub import HubDataset

    files = {**corpus_files(n_files=2), "README.md": CARD}
    repo, commit = new_repo(hub, files)
    m = prepare(load_config(config(tmp_path / "c.toml", tmp_path / "c", hub_source(repo, "", 'config = "default"\n'),
                                   str(tokenizer_file))), progress=False)
    parquet = ["data/train-00000.parquet", "data/train-00001.parquet"]
    pin = m["sources"][0]["hub"]
    assert (pin["commit"], pin["config"], pin["split"], [f["path"] for f in pin["files"]]) == (
        commit, "default", "train", parquet)
    # The same files named by a glob: the same prepared data.
    m_glob = prepare(load_config(config(tmp_path / "g.toml", tmp_path / "c", hub_source(repo, "data/train-*"),
                                        str(tokenizer_file))), progress=False)
    assert m_glob["fingerprint"] == m["fingerprint"]

    def chosen(config: str, split: str = "train") -> list[str]:
        ds = HubDataset(repo, "main", "", "data source 0", config=config, split=split)
        ds.close()
        return [f.path for f in ds.files]

    assert chosen("default", "test") == ["data/small.jsonl"] and chosen("extra") == ["data/extra.jsonl.gz"]
    with pytest.raises(DataError) as e:
        chosen("sample-10BT")
    assert str(e.value) == (f"data source 0: {repo} at {commit[:12]} declares no config 'sample-10BT' (its configs: "
                            "default, extra): set config to one of them")
    with pytest.raises(DataError) as e:
        chosen("extra", "validation")
    assert str(e.value) == (f"data source 0: {repo} at {commit[:12]}: config 'extra' has no split 'validation' (its "
                            "splits: train): set split to one of them")
    # What the README says at the pinned commit counts, not what it says later.
    hub.put(f"datasets/{repo}", {"README.md": CARD.replace(b"data/extra.jsonl.gz", b"data/small.jsonl")})
    assert HubDataset(repo, commit, "", "s", config="extra").files[0].path == "data/extra.jsonl.gz"
    bare, _ = new_repo(hub, corpus_files(n_files=1))
    with pytest.raises(DataError, match=r"declares no configs \(its README.md has no configs: list\): select the "
                                        r'files with files = "..." instead'):
        HubDataset(bare, "main", "", "s", config="default")


def test_every_form_of_data_files_the_hub_declares_is_read():
    from baton.data.hub_card import declared_configs

    card = """---
configs:
- config_name: one
  data_files: a/*.parquet
- config_name: many
  data_files: [a/*.parquet, b/*.parquet]
- config_name: splits
  data_files:
  - split: train
    path: [t/0.parquet, t/1.parquet]
  - split: test
    path: e/*.jsonl
- config_name: table
  data_files: {train: t/*.parquet, validation: [v/*.parquet]}
---
text
"""
    assert declared_configs(card, "r") == {
        "one": {"train": ["a/*.parquet"]}, "many": {"train": ["a/*.parquet", "b/*.parquet"]},
        "splits": {"train": ["t/0.parquet", "t/1.parquet"], "test": ["e/*.jsonl"]},
        "table": {"train": ["t/*.parquet"], "validation": ["v/*.parquet"]}}
    with pytest.raises(DataError, match=r"^r: the YAML front matter of its README.md does not parse at line 3: "):
        declared_configs("---\nconfigs:\n  - [unclosed\n---\n", "r")
    with pytest.raises(DataError, match=r"^r: its README.md declares a config that is not a config_name with "
                                        r"data_files \(\{'config_name': 'x'\}\)"):
        declared_configs("---\nconfigs:\n- config_name: x\n---\n", "r")


# ------------------------------------------------------------------------ a streaming prepare, killed again and again

KILL_FILES, KILL_LINES, KILL_SHARD, KILL_PREFETCH = 6, 400, 3000, 1


@pytest.fixture(scope="module")
def killed_corpus(hub_server, tmp_path_factory, tokenizer_file):
    """A repository of six Parquet files; the bytes of an uninterrupted prepare; the tokens the prepared stream holds
    up to the end of each file (a prepare of the files up to it: the stream is the files' documents in order); and a
    zygote whose children talk to the local Hub."""
    from support.zygote import Zygote

    lines = stdlib_lines(KILL_FILES * KILL_LINES)
    files = {f"data/part-{k:03d}.parquet": parquet_bytes(lines[k * KILL_LINES:(k + 1) * KILL_LINES], k * KILL_LINES)
             for k in range(KILL_FILES)}
    repo, _ = new_repo(hub_server, files)
    base = tmp_path_factory.mktemp("killed")
    local = write_local(base / "local", files)
    data = f"shard_tokens = {KILL_SHARD}\nprepare_workers = 1\n"
    ends = []
    for j in range(KILL_FILES):
        src = f'[[data.sources]]\nkind = "parquet"\npath = "{local}/data/part-00[0-{j}].parquet"\n'
        ends.append(prepare(load_config(config(base / f"upto{j}.toml", base / f"upto{j}", src, str(tokenizer_file),
                                               data)), progress=False)["total_tokens"])
    # A shard that ends exactly where a file ends would leave the file's last document "in progress" (a journal
    # records where the document in progress starts): the corpus is chosen so that none does.
    assert all(e % KILL_SHARD for e in ends)
    zygote = Zygote(env={"HF_ENDPOINT": hub_server.url, "HF_TOKEN": hub_server.token, "HF_HUB_DISABLE_XET": "1",
                         "HF_HOME": str(base / "hf-home")})
    yield _Corpus({"repo": repo, "files": files, "ref": folder_bytes(base / f"upto{KILL_FILES - 1}"), "ends": ends,
                   "base": base, "zygote": zygote, "data": data, "tokenizer": str(tokenizer_file)})
    zygote.close()


class _Corpus(dict):
    def __repr__(self) -> str:  # a failing example names its kills, not the corpus's bytes
        return f"<corpus {self['repo']}>"


def _source_files(folder: Path) -> int:
    """As ``_on_disk``, while a prepare deletes folders under it (os.walk skips what vanished)."""
    import os

    return sum(1 for _, _, names in os.walk(folder) for n in names if n.endswith((".parquet", ".incomplete")))


def _journaled_tokens(journal: Path) -> int:
    """Tokens in the shards the journal records as written (each record follows its shard onto the disk)."""
    try:
        lines = journal.read_bytes().split(b"\n")
    except FileNotFoundError:
        return 0
    total = 0
    for line in lines[1:]:
        try:
            rec = json.loads(line)
        except ValueError:
            break
        total += (rec.get("shard") or {}).get("tokens", 0)
    return total


KILL = st.one_of(st.tuples(st.just("random"), st.floats(0.0, 2.0)),  # at any moment
                 st.tuples(st.just("download"), st.integers(0, KILL_FILES - 1)),  # half-way through file j's download
                 st.tuples(st.just("journaled"), st.integers(0, KILL_FILES - 2)))  # once file j's tokens are journaled


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(kills=st.lists(KILL, min_size=1, max_size=4))
@example(kills=[("download", 1), ("download", 2), ("download", 3), ("download", 4)])
@example(kills=[("random", 0.6), ("download", 3), ("journaled", 3), ("journaled", 4)])
def test_a_streaming_prepare_killed_any_number_of_times_keeps_its_disk_bound_and_fetches_no_finished_file(
        killed_corpus, hub, kills):
    """Each session is a real process SIGKILLed at its kill point. Through every session the source files on disk
    (whole or partial) stay within the one being read, the prefetch and one partial; a session fetches no file whose
    tokens were all journaled when the previous one died; the last session finishes with the bytes of an
    uninterrupted prepare and leaves no source file behind."""
    import os
    import signal
    import tempfile
    import time

    c = killed_corpus
    blobs = {hashlib.sha256(data).hexdigest(): i for i, data in enumerate(c["files"].values())}
    out = Path(tempfile.mkdtemp(dir=c["base"], prefix="out-"))
    cfg = config(out.with_suffix(".toml"), out, hub_source(c["repo"], "data/*.parquet",
                                                           f"stream = true\nprefetch = {KILL_PREFETCH}\n"),
                 c["tokenizer"], c["data"])
    streaming, journal = out / ".hub-files", out / "prepare.journal"
    bound = 1 + KILL_PREFETCH + 1
    finished: set[int] = set()  # files whose tokens were all journaled when the last session died
    for kind, at in [*kills, ("none", None)]:
        release = None
        if kind == "download":
            name = list(c["files"])[at]
            release = hub.stall(f"datasets/{c['repo']}", name, len(c["files"][name]) // 2)
            blob = hashlib.sha256(c["files"][name]).hexdigest()
        mark, t0, peak = len(hub.requests), time.monotonic(), 0
        child = c["zygote"].spawn(["prepare", "-c", str(cfg), "--no-progress"], c["base"] / "logs")
        stops = {"random": lambda: time.monotonic() - t0 >= at,
                 "download": lambda: ("GET", f"/lfs-blob/{blob}") in hub.requests[mark:],
                 "journaled": lambda: _journaled_tokens(journal) >= c["ends"][at],
                 "none": lambda: False}
        try:
            while child.alive() and time.monotonic() - t0 < 240:  # the limit only catches a hang
                peak = max(peak, _source_files(streaming))
                if stops[kind]():
                    try:
                        os.killpg(child.pid, signal.SIGKILL)  # the child's own group: its threads and workers
                    except ProcessLookupError:  # not yet in a group of its own (killed as it started)
                        child.kill()
                    break
                time.sleep(0.002)
            end = time.monotonic() + 60
            while child.alive() and time.monotonic() < end:  # (a child killed as it forked wrote no output file)
                time.sleep(0.005)
            status = child.status
        finally:
            if release is not None:
                hub.stalls.pop(blob, None)
                release.set()
        peak = max(peak, _source_files(streaming))
        assert peak <= bound, f"{peak} source files on disk after {kills}"
        again = {blobs[p.rsplit("/", 1)[1]] for m, p in hub.requests[mark:]
                 if m == "GET" and p.startswith("/lfs-blob/") and p.rsplit("/", 1)[1] in blobs}
        assert not again & finished, f"fetched {sorted(again & finished)} again, all journaled, after {kills}"
        if status == 0:
            break
        assert status == -signal.SIGKILL, child.stderr_text()[-3000:]
        finished = {j for j, end in enumerate(c["ends"]) if end <= _journaled_tokens(journal)}
    assert status == 0
    assert folder_bytes(out) == c["ref"] and not streaming.exists() and not journal.exists()
