"""`baton prepare`: text sources -> tokenizer -> packed token shards + a content-hashed manifest."""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import shutil
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from ..config import Config, SourceConfig
from ..errors import DataError
from ..hashing import sha256_file
from .manifest import FORMAT, MANIFEST, corpus_fingerprint, load_manifest
from .shards import dtype_for_vocab, read_header, write_shard

log = logging.getLogger(__name__)

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>")
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_TRAIN_BYTES = 256 << 20  # enough text for a good BPE; training on more only costs time
ENCODE_BATCH = 256


# ---------------------------------------------------------------------------------------------- sources


def _expand(path: str) -> list[Path]:
    p = Path(path)
    if p.is_dir():
        return sorted(q for q in p.rglob("*") if q.is_file())
    if p.is_file():
        return [p]
    return sorted(Path(q) for q in glob.glob(path, recursive=True) if Path(q).is_file())


def stdlib_files() -> list[Path]:
    """The running Python's own top-level library modules: a corpus present on every machine."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def iter_documents(src: SourceConfig) -> Iterator[str]:
    """Yield the source's documents in a deterministic order, honouring ``max_bytes``."""
    budget = src.max_bytes or float("inf")
    for doc in _raw_documents(src):
        if not doc:
            continue
        size = len(doc.encode("utf-8"))
        if size > budget:
            return
        budget -= size
        yield doc


def _raw_documents(src: SourceConfig) -> Iterator[str]:
    if src.kind == "stdlib":
        for f in stdlib_files():
            yield f.read_text(encoding="utf-8", errors="replace")
        return
    files = _expand(src.path)
    if not files and src.kind != "hf_dataset":
        raise DataError(f"data source {src.kind} {src.path!r} matches no files (check the path or glob)")
    if src.kind == "text":
        for f in files:
            yield f.read_text(encoding="utf-8", errors="replace")
    elif src.kind == "jsonl":
        for f in files:
            with open(f, encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DataError(f"{f}:{lineno} is not valid JSON ({e.msg})") from None
                    if not isinstance(obj, dict) or src.field not in obj:
                        raise DataError(f"{f}:{lineno} has no field {src.field!r} (set field = \"...\" on the source)")
                    yield str(obj[src.field])
    elif src.kind == "parquet":
        import pyarrow.parquet as pq

        for f in files:
            pf = pq.ParquetFile(f)
            if src.field not in pf.schema_arrow.names:
                raise DataError(f"{f} has no column {src.field!r} (columns: {', '.join(pf.schema_arrow.names)})")
            for batch in pf.iter_batches(columns=[src.field], batch_size=1024):
                for v in batch.column(0).to_pylist():
                    if v is not None:
                        yield str(v)
    elif src.kind == "hf_dataset":
        try:
            import datasets
        except ImportError:
            raise DataError("source kind hf_dataset needs the `datasets` package (pip install datasets)") from None
        ds = datasets.load_from_disk(src.path)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds["train"] if "train" in ds else ds[sorted(ds)[0]]
        if src.field not in ds.column_names:
            raise DataError(f"dataset {src.path} has no column {src.field!r} (columns: {', '.join(ds.column_names)})")
        for row in ds.select_columns([src.field]):
            yield str(row[src.field])


def iter_mix(sources: list[SourceConfig], seed: int) -> Iterator[tuple[int, str]]:
    """(source index, document), each source repeated by its weight.

    A weight of 2.5 emits every document twice plus a seeded half of them a third time; the choice is
    a hash of (seed, source, document index), so it is the same on every machine and every rerun.
    """
    for si, src in enumerate(sources):
        whole, frac = int(src.weight), src.weight - int(src.weight)
        for di, doc in enumerate(iter_documents(src)):
            reps = whole
            if frac:
                h = hashlib.sha256(f"{seed}|{si}|{di}".encode()).digest()
                reps += int.from_bytes(h[:8], "little") / 2**64 < frac
            for _ in range(reps):
                yield si, doc


# -------------------------------------------------------------------------------------------- tokenizer


def find_eos(tok: Tokenizer) -> tuple[str, int]:
    for name in EOS_CANDIDATES:
        tid = tok.token_to_id(name)
        if tid is not None:
            return name, tid
    raise DataError(
        f"the tokenizer has no end-of-text token (looked for {', '.join(EOS_CANDIDATES)}); "
        "add one as a special token"
    )


def train_tokenizer(cfg: Config) -> Tokenizer:
    """A byte-level BPE trained on the configured sources (the first TOKENIZER_TRAIN_BYTES of text)."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.data.tokenizer_vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def texts() -> Iterator[str]:
        budget = TOKENIZER_TRAIN_BYTES
        for _, doc in iter_mix(cfg.data.sources, cfg.data.shuffle_seed):
            yield doc
            budget -= len(doc)
            if budget <= 0:
                return

    tok.train_from_iterator(texts(), trainer=trainer)
    return tok


def load_tokenizer(spec: str) -> Tokenizer:
    p = Path(spec)
    if p.is_dir():
        p = p / TOKENIZER_FILE
    if not p.is_file():
        raise DataError(
            f"tokenizer {spec!r} not found (give a tokenizer.json, a folder holding one, or \"\" to train one)"
        )
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise DataError(f"tokenizer {p} could not be loaded: {e}") from None


def data_tokenizer(data_dir: str | Path) -> Tokenizer:
    return load_tokenizer(str(Path(data_dir) / TOKENIZER_FILE))


# ---------------------------------------------------------------------------------------------- prepare


def _spec(cfg: Config) -> str:
    """What determines the prepared bytes; a rerun with the same spec can reuse the folder."""
    d = cfg.data
    tok = ""
    if d.tokenizer:
        p = Path(d.tokenizer)
        tok = sha256_file(p / TOKENIZER_FILE if p.is_dir() else p)
    body = {
        "format": FORMAT,
        "sources": [asdict(s) for s in d.sources],
        "tokenizer": tok or {"train_vocab": d.tokenizer_vocab},
        "shard_tokens": d.shard_tokens,
        "seed": d.shuffle_seed,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def already_prepared(cfg: Config) -> dict[str, Any] | None:
    out = Path(cfg.data.dir)
    if not (out / MANIFEST).is_file():
        return None
    try:
        m = load_manifest(out)
        if m.get("spec") != _spec(cfg):
            return None
        for s in m["shards"]:
            _, count = read_header(out / s["file"])
            if count != s["tokens"]:
                return None
    except DataError:
        return None
    return m


def prepare(cfg: Config, force: bool = False, progress: bool = True) -> dict[str, Any]:
    """Write shards and manifest into ``cfg.data.dir``; reuse them when the spec is unchanged."""
    out = Path(cfg.data.dir)
    if cfg.data.tokenizer:
        load_tokenizer(cfg.data.tokenizer)  # fail on a bad path before any work
    if not force and (m := already_prepared(cfg)):
        log.info("data in %s is already prepared for this config (%s tokens, fingerprint %s)",
                 out, f"{m['total_tokens']:,}", m["fingerprint"])
        return m
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t0 = time.time()
    if cfg.data.tokenizer:
        src = Path(cfg.data.tokenizer)
        shutil.copyfile(src / TOKENIZER_FILE if src.is_dir() else src, out / TOKENIZER_FILE)
        tok = load_tokenizer(str(out / TOKENIZER_FILE))
    else:
        log.info("training a byte-level BPE tokenizer (vocab %d) on the sources", cfg.data.tokenizer_vocab)
        tok = train_tokenizer(cfg)
        tok.save(str(out / TOKENIZER_FILE))
        tok = load_tokenizer(str(out / TOKENIZER_FILE))  # what later runs will see, byte for byte
    eos_token, eos_id = find_eos(tok)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = dtype_for_vocab(vocab)

    shards: list[dict[str, Any]] = []
    per_source = [{"documents": 0, "tokens": 0} for _ in cfg.data.sources]
    buf = np.empty(cfg.data.shard_tokens, dtype=dtype)
    fill = 0
    buf_sources: set[int] = set()

    def flush() -> None:
        nonlocal fill
        name = f"shard-{len(shards):05d}.bin"
        digest = write_shard(out / name, buf[:fill])
        shards.append({"file": name, "sha256": digest, "tokens": int(fill), "sources": sorted(buf_sources)})
        fill = 0
        buf_sources.clear()

    bar = _progress(progress)
    batch: list[tuple[int, str]] = []

    def encode(batch: list[tuple[int, str]]) -> None:
        nonlocal fill
        encs = tok.encode_batch([d for _, d in batch], add_special_tokens=False)
        for (si, _), enc in zip(batch, encs):
            ids = enc.ids + [eos_id]
            cap = cfg.data.sources[si].max_tokens
            if cap:
                ids = ids[: max(0, cap - per_source[si]["tokens"])]
            if not ids:
                continue
            per_source[si]["documents"] += 1
            per_source[si]["tokens"] += len(ids)
            arr = np.asarray(ids, dtype=dtype)
            pos = 0
            while pos < arr.size:
                take = min(arr.size - pos, buf.size - fill)
                buf[fill : fill + take] = arr[pos : pos + take]
                fill += take
                pos += take
                buf_sources.add(si)
                if fill == buf.size:
                    flush()
            bar.update(len(ids))

    for item in iter_mix(cfg.data.sources, cfg.data.shuffle_seed):
        batch.append(item)
        if len(batch) >= ENCODE_BATCH:
            encode(batch)
            batch = []
    if batch:
        encode(batch)
    if fill:
        flush()
    bar.close()
    total = sum(s["tokens"] for s in shards)
    if total == 0:
        raise DataError("the data sources produced no tokens (check paths, fields and caps)")
    tok_sha = sha256_file(out / TOKENIZER_FILE)
    manifest = {
        "format": FORMAT,
        "spec": _spec(cfg),
        "dtype": dtype.name,
        "tokenizer": {"file": TOKENIZER_FILE, "sha256": tok_sha, "vocab_size": vocab, "eos_token": eos_token, "eos_id": eos_id},
        "sources": [{**asdict(s), **per_source[i]} for i, s in enumerate(cfg.data.sources)],
        "shards": shards,
        "n_shards": len(shards),
        "total_tokens": total,
        "fingerprint": corpus_fingerprint(shards, tok_sha, dtype.name),
    }
    # The manifest is written last: a folder without one is an unfinished prepare, never trusted.
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    tmp.replace(out / MANIFEST)
    dt = time.time() - t0
    log.info("prepared %s tokens in %d shards (%.0f tokens/s), fingerprint %s", f"{total:,}", len(shards),
             total / max(dt, 1e-9), manifest["fingerprint"])
    return manifest


def _progress(enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=None, unit="tok", unit_scale=True, desc="prepare", disable=not enabled, mininterval=1.0)
