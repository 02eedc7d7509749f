"""`baton prepare`: the source mix -> tokenizer -> packed token shards + a content-hashed manifest.

Streaming and bounded: documents are read lazily, encoded in batches (at most a few in flight), and
packed into a shard buffer of ``data.shard_tokens``; memory does not grow with the corpus (the largest
single document is the one thing held whole). Resumable: after each shard is on disk, the journal
records where the next one starts, and a rerun after any interruption continues there, reusing the
tokenizer, and writes the same bytes an uninterrupted prepare writes. The manifest is written last: a
folder without one is an unfinished prepare and is never read by training.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import shutil
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config, SourceConfig
from ..errors import DataError
from ..guard import places, resolved
from ..hashing import sha256_file
from . import decontam
from .hub import STREAM_DIR, check_moved, hub_tokenizer
from .journal import JOURNAL, Journal
from .manifest import FORMAT, MANIFEST, corpus_fingerprint, load_manifest
from .mix import Mix
from .shards import dtype_for_vocab, read_header, write_shard
from .sources import SourceReader, decode_text
from .tokenize import (  # noqa: F401
    TOKENIZER_FILE,
    Encoder,
    auto_workers,
    data_tokenizer,
    find_eos,
    load_tokenizer,
    tokenizer_path,
    train_tokenizer,
)

log = logging.getLogger(__name__)

ENCODE_BATCH = 256  # documents per encode call: enough for encode_batch to use every core
BATCH_BYTES = 2 << 20  # ... and at most this much text, so one batch of huge documents stays small
SHARD_KEYS = ("file", "sha256", "tokens", "sources")  # a shard's record, in manifest order
ACCT = ("documents", "tokens", "dropped_documents", "dropped_tokens")  # per-source counts, in manifest order
ORDER = "interleaved by share of estimated size (see baton/data/mix.py)"


# How a Hub source is fetched, not what it holds (its files' hashes are in the spec): free to change on a rerun,
# so pinning the revision a branch named to its commit keeps the prepared folder.
# A config and split stand for the files they select at the commit, which are in the spec by their hashes.
NOT_IN_SPEC = ("stream", "prefetch", "revision", "config", "split")
# Fields of Hub sources only: left out of other sources' spec, which stays what it was before they existed (a
# folder prepared then is still reused).
HUB_ONLY = ("repo", "revision", "files", "stream", "prefetch", "config", "split")


def _spec_source(s: SourceConfig) -> dict[str, Any]:
    return {k: v for k, v in asdict(s).items() if k not in NOT_IN_SPEC and (s.kind == "hub" or k not in HUB_ONLY)}


def _spec(cfg: Config, readers: list[SourceReader], tok: Path | None = None) -> str:
    """What determines the prepared bytes; a rerun with the same spec reuses or continues the folder."""
    d = cfg.data
    tok = tok or (tokenizer_path(d.tokenizer) if d.tokenizer else None)
    body = {
        "format": FORMAT,
        "sources": [_spec_source(s) for s in d.sources],
        "files": [r.identity() for r in readers],
        "tokenizer": sha256_file(tok) if tok else {"train_vocab": d.tokenizer_vocab},
        "shard_tokens": d.shard_tokens,
        "seed": d.shuffle_seed,
        "decontaminate": [decontam.describe(d.decontaminate), d.decontam_ngram] if d.decontaminate else None,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def already_prepared(cfg: Config, readers: list[SourceReader] | None = None,
                     tok: Path | None = None) -> dict[str, Any] | None:
    out = Path(cfg.data.dir)
    if not (out / MANIFEST).is_file():
        return None
    try:
        readers = readers if readers is not None else _readers(cfg)
        m = load_manifest(out)
        if m.get("spec") != _spec(cfg, readers, tok):
            return None
        for s in m["shards"]:
            _, count = read_header(out / s["file"])
            if count != s["tokens"]:
                return None
    except DataError:
        return None
    return m


def _readers(cfg: Config) -> list[SourceReader]:
    # baton's own folders (the data, the run, a local store) are never read as documents, even where a source's
    # folder or glob reaches them: the next prepare would read its own shards and manifest as text.
    own = tuple(resolved(folder) for _, _, folder in places(cfg))
    return [SourceReader(s, i, cfg.data.dir, own) for i, s in enumerate(cfg.data.sources)]


def _clean(out: Path) -> None:
    """Remove what a prepare writes, and only that: the folder may hold the user's other files."""
    for pattern in ("shard-*.bin", "*.tmp", MANIFEST, TOKENIZER_FILE, JOURNAL):
        for p in out.glob(pattern):
            p.unlink()
    shutil.rmtree(out / STREAM_DIR, ignore_errors=True)


def _tokenizer(cfg: Config) -> tuple[Path | None, dict[str, Any] | None]:
    """The configured tokenizer file (a Hub one resolved to its commit and fetched, once per prepare) and, for a
    Hub tokenizer, where it came from."""
    spec = cfg.data.tokenizer
    if not spec:
        return None, None
    if spec.startswith("hf://"):
        path, source = hub_tokenizer(spec)
        load_tokenizer(path)  # a file that is no tokenizer: said before any work
        return path, source
    load_tokenizer(spec)  # fail on a bad path before any work
    return tokenizer_path(spec), None


def _pins(out: Path, journal: Journal) -> dict[int, dict[str, Any]]:
    """The Hub sources' pins recorded by the last prepare of this folder (its manifest, else its journal)."""
    recorded: Any = None
    try:
        recorded = [s.get("hub") for s in load_manifest(out).get("sources", [])]
    except (DataError, AttributeError):
        loaded = journal.load()
        if loaded is not None:
            recorded = loaded[0].get("hub")
    if not isinstance(recorded, list):
        return {}
    return {i: p for i, p in enumerate(recorded) if isinstance(p, dict)}


def prepare(cfg: Config, force: bool = False, progress: bool = True) -> dict[str, Any]:
    """Write shards and manifest into ``cfg.data.dir``; reuse them when unchanged, continue them when cut short."""
    tok, tok_source = _tokenizer(cfg)
    readers = _readers(cfg)
    try:
        m = _prepare(cfg, readers, tok, tok_source, force, progress)
    finally:
        for r in readers:
            r.close()  # waits for downloads in flight, so nothing lands in the folder after the cleanup below
    shutil.rmtree(Path(cfg.data.dir) / STREAM_DIR, ignore_errors=True)  # files fetched ahead, never read (caps)
    return m


def _prepare(cfg: Config, readers: list[SourceReader], tok: Path | None, tok_source: dict[str, Any] | None,
             force: bool, progress: bool) -> dict[str, Any]:
    out = Path(cfg.data.dir)
    journal = Journal(out)
    if not force:
        check_moved(out, _pins(out, journal), [r.hub for r in readers])
    if not force and (m := already_prepared(cfg, readers, tok)):
        (out / JOURNAL).unlink(missing_ok=True)  # a kill between the manifest and this cleanup leaves one
        log.info("data in %s is already prepared for this config (%s tokens, fingerprint %s)",
                 out, f"{m['total_tokens']:,}", m["fingerprint"])
        return m
    spec = _spec(cfg, readers, tok)
    resumed = None if force else _resumable(out, journal, spec)
    t0 = time.time()
    shards: list[dict]
    state: dict | None
    if resumed is None:
        for r in readers:
            r.check_field()
        out.mkdir(parents=True, exist_ok=True)
        _clean(out)
        _make_tokenizer(cfg, readers, out, tok)
        journal.write({"spec": spec, "tokenizer_sha256": sha256_file(out / TOKENIZER_FILE),
                       "hub": [r.hub.pin() if r.hub else None for r in readers]})
        shards, state = [], None
    else:
        shards, state = resumed
        log.info("continuing an interrupted prepare in %s at shard %d (tokenizer reused)", out, len(shards))
    job = _Job(cfg, readers, out, journal, shards, progress)
    acct = job.run(state)
    manifest = job.manifest(spec, acct, tok_source)
    # The manifest is written last: a folder without one is an unfinished prepare, never trusted.
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    tmp.replace(out / MANIFEST)
    (out / JOURNAL).unlink(missing_ok=True)
    log.info("prepared %s tokens in %d shards (%s tokens/s encoded and written, %.0f s in all), fingerprint %s",
             f"{manifest['total_tokens']:,}", manifest["n_shards"], f"{job.written / max(job.seconds, 1e-9):,.0f}",
             time.time() - t0, manifest["fingerprint"])
    if manifest["decontamination"]:
        dc = manifest["decontamination"]
        log.info("decontamination dropped %d documents (%s tokens)", dc["dropped_documents"],
                 f"{dc['dropped_tokens']:,}")
    return manifest


def _make_tokenizer(cfg: Config, readers: list[SourceReader], out: Path, tok: Path | None) -> None:
    if tok is not None:
        shutil.copyfile(tok, out / TOKENIZER_FILE)
        return
    log.info("training a byte-level BPE tokenizer (vocab %d) on the sources", cfg.data.tokenizer_vocab)
    mix = Mix(readers, cfg.data.shuffle_seed)

    def texts():
        while (item := mix.draw()) is not None:
            yield item[1]

    train_tokenizer(texts(), cfg.data.tokenizer_vocab).save(str(out / TOKENIZER_FILE))


def _resumable(out: Path, journal: Journal, spec: str) -> tuple[list[dict], dict | None] | None:
    """(finished shards, where to continue) from the journal, or None to start afresh."""
    loaded = journal.load()
    if loaded is None:
        return None
    header, records = loaded
    tok = out / TOKENIZER_FILE
    if header.get("spec") != spec or not tok.is_file() or sha256_file(tok) != header.get("tokenizer_sha256"):
        return None
    good = []
    for r in records:  # trust a record only while the shard it names is whole
        s = r.get("shard")
        if s is not None:
            try:
                if read_header(out / s["file"])[1] != s["tokens"]:
                    break
            except DataError:
                break
        good.append(r)
        if "done" in r:
            break
    if len(good) != len(records):
        journal.write(header, good)
    shards = [{k: r["shard"][k] for k in SHARD_KEYS} for r in good if r.get("shard")]
    keep = {s["file"] for s in shards}
    for p in list(out.glob("shard-*.bin")) + list(out.glob("*.tmp")):
        if p.name not in keep:
            p.unlink()
    return shards, (good[-1] if good else None)


class _Job:
    """One pass of the prepare loop: draw batches, encode them (in flight), pack tokens into shards."""

    def __init__(self, cfg: Config, readers: list[SourceReader], out: Path, journal: Journal,
                 shards: list[dict], progress: bool):
        self.cfg, self.readers, self.out, self.journal, self.shards = cfg, readers, out, journal, shards
        self.progress = progress
        tok = data_tokenizer(out)
        self.eos_token, self.eos_id = find_eos(tok)
        self.vocab = tok.get_vocab_size(with_added_tokens=True)
        self.dtype = dtype_for_vocab(self.vocab)
        self.caps = [s.max_tokens for s in cfg.data.sources]
        self.decon = None
        if cfg.data.decontaminate:
            files = decontam.eval_files(cfg.data.decontaminate)
            texts = [np.array(tok.encode(decode_text(f.read_bytes(), f), add_special_tokens=False).ids, dtype=np.int64)
                     for f in files]
            decontam.check_lengths(files, texts, cfg.data.decontam_ngram)
            self.decon = decontam.Decontaminator(texts, cfg.data.decontam_ngram)
        self.buf = np.empty(cfg.data.shard_tokens, dtype=self.dtype)
        self.fill = 0
        self.buf_sources: set[int] = set()
        self.written = 0
        self.seconds = 0.0

    # ---- the loop
    def run(self, state: dict | None) -> list[dict[str, int]]:
        if state is not None and "done" in state:
            return state["done"]
        seed = self.cfg.data.shuffle_seed
        resume = state["resume"] if state else None
        acct = copy.deepcopy(resume["acct"]) if resume else [dict.fromkeys(ACCT, 0) for _ in self.readers]
        mix = Mix(self.readers, seed, resume["mix"] if resume else None)
        first = None
        if resume:
            for _ in range(resume["skip_docs"]):  # the batch's documents before the one in progress
                mix.draw()
            item = mix.draw()
            assert item is not None  # the journal recorded this document as in progress, so the mix has it
            si, text, nbytes = item
            first = ([resume["mix"]], resume["skip_docs"], [si], [text], nbytes, resume["skip_tokens"])
        for i, a in enumerate(acct):
            if self.caps[i] and a["tokens"] >= self.caps[i]:
                mix.deactivate(i)
        est = sum(mix.est)
        workers = auto_workers(self.cfg.data.prepare_workers, est)
        bar = _progress(self.progress, est, sum(mix.consumed), sum(s["tokens"] for s in self.shards))
        encoder = Encoder(self.out / TOKENIZER_FILE, self.eos_id, self.dtype, self.decon, workers)
        t0 = time.time()
        try:
            pending: deque[tuple[tuple, Future]] = deque()
            for batch in self._batches(mix, first):
                pending.append((batch, encoder.submit(batch[3])))
                while len(pending) >= encoder.depth:
                    self._consume(*pending.popleft(), acct, mix, bar, t0)
            while pending:
                self._consume(*pending.popleft(), acct, mix, bar, t0)
            bar.total = bar.n  # the sizes were estimates; the text is all read now
        finally:
            encoder.close()
            bar.close()
            self.seconds = time.time() - t0
        if self.fill:
            self._flush({"done": acct})
        else:
            self.journal.append({"shard": None, "done": acct})
        return acct

    def _batches(self, mix: Mix, first):
        if first is not None:
            yield first
        while True:
            # The mix's state before each document: a shard that ends inside a document records where that
            # document starts, so a continued prepare reads (and fetches) nothing it had finished.
            snaps: list[dict] = []
            srcs: list[int] = []
            docs: list[str] = []
            nbytes = 0
            while len(docs) < ENCODE_BATCH and nbytes < BATCH_BYTES:
                snap = mix.snapshot()
                item = mix.draw()
                if item is None:
                    break
                snaps.append(snap)
                srcs.append(item[0])
                docs.append(item[1])
                nbytes += item[2]
            if not docs:
                return
            yield snaps, 0, srcs, docs, nbytes, 0

    def _consume(self, batch, fut, acct, mix: Mix, bar, t0: float) -> None:
        snaps, first_index, srcs, _, nbytes, skip = batch
        tokens, lens, dropped = fut.result()
        off = 0
        for k, si in enumerate(srcs):
            a, n = acct[si], int(lens[k])
            if dropped[k]:
                a["dropped_documents"] += 1
                a["dropped_tokens"] += n
                continue
            arr = tokens[off : off + n]
            off += n
            cap = self.caps[si]
            if cap:
                room = cap - a["tokens"]
                if room <= 0:
                    mix.deactivate(si)
                    continue
                arr = arr[:room]
            # snaps[k]: the mix before document k; first_index: documents to skip after it (a journal's own).
            self._append(arr, skip if k == 0 else 0, si, snaps[k], first_index if k == 0 else 0, acct)
            a["documents"] += 1
            a["tokens"] += arr.size
            if cap and a["tokens"] >= cap:
                mix.deactivate(si)
        bar.update(nbytes)
        bar.set_postfix_str(f"{self.written / max(time.time() - t0, 1e-9):,.0f} tok/s", refresh=False)

    # ---- shards
    def _append(self, arr: np.ndarray, pos: int, si: int, snap: dict, doc_index: int, acct) -> None:
        """Pack ``arr[pos:]``; a shard that fills records where its successor starts (before this document)."""
        cap = self.buf.size
        while pos < arr.size:
            take = min(arr.size - pos, cap - self.fill)
            self.buf[self.fill : self.fill + take] = arr[pos : pos + take]
            self.fill += take
            pos += take
            self.written += take
            self.buf_sources.add(si)
            if self.fill == cap:
                self._flush({"resume": {"mix": snap, "skip_docs": doc_index, "skip_tokens": pos,
                                        "acct": copy.deepcopy(acct)}})

    def _flush(self, record: dict) -> None:
        name = f"shard-{len(self.shards):05d}.bin"
        digest = write_shard(self.out / name, self.buf[: self.fill])
        shard = {"file": name, "sha256": digest, "tokens": int(self.fill), "sources": sorted(self.buf_sources)}
        self.shards.append(shard)
        self.journal.append({"shard": shard, **record})  # only after the shard is whole on disk
        self.fill = 0
        self.buf_sources.clear()

    # ---- the manifest
    def manifest(self, spec: str, acct: list[dict[str, int]], tok_source: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
        total = sum(s["tokens"] for s in self.shards)
        if total == 0:
            raise DataError("the data sources produced no tokens (check paths, fields and caps)")
        tok_sha = sha256_file(self.out / TOKENIZER_FILE)
        d = self.cfg.data
        dc = None
        if self.decon is not None:
            dc = {"ngram": d.decontam_ngram, "texts": decontam.describe(d.decontaminate),
                  "eval_ngrams": self.decon.n_ngrams,
                  "dropped_documents": sum(a["dropped_documents"] for a in acct),
                  "dropped_tokens": sum(a["dropped_tokens"] for a in acct)}
        return {
            "format": FORMAT,
            "spec": spec,
            "dtype": self.dtype.name,
            "tokenizer": {"file": TOKENIZER_FILE, "sha256": tok_sha, "vocab_size": self.vocab,
                          "eos_token": self.eos_token, "eos_id": self.eos_id,
                          **({"hub": tok_source} if tok_source else {})},
            "mix": {"seed": d.shuffle_seed, "order": ORDER},
            "sources": [{**asdict(s), "files": len(r.files), "est_bytes": r.est_bytes, **{k: acct[i][k] for k in ACCT},
                         **({"hub": r.hub.pin()} if r.hub else {})}
                        for i, (s, r) in enumerate(zip(d.sources, self.readers))],
            "decontamination": dc,
            "shards": self.shards,
            "n_shards": len(self.shards),
            "total_tokens": total,
            "fingerprint": corpus_fingerprint(self.shards, tok_sha, self.dtype.name),
        }


def _progress(enabled: bool, total_bytes: int, done_bytes: int, done_tokens: int):
    """Text bytes against the estimated total (hence the ETA), with tokens/s alongside."""
    from tqdm.auto import tqdm

    bar = tqdm(total=max(total_bytes, done_bytes), initial=done_bytes, unit="B", unit_scale=True, desc="prepare",
               disable=not enabled, mininterval=1.0,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} text "
                          "[{elapsed}<{remaining}]{postfix}")
    if done_tokens:
        bar.set_description(f"prepare (continuing after {done_tokens:,} tokens)")
    return bar
