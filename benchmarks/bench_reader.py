"""Reader throughput on random windows against a bare numpy memmap read of the same windows (target >= 0.5).

Both sides run in this one process on the same token file (in the page cache), alternating batch by batch:

- reader: ``WindowDataset.train_batch(start, count)``: the keyed permutation for the sample numbers, the
  gather of each window's ``seq_len + 1`` tokens across shards, and the int64 tensors (inputs and labels)
  the model takes. Measured reading consecutive batches as training does (the target), and at random
  jumps (a resume; the permutation is then computed for just the batch).
- bare: the window ids handed over for free, then the fastest plain numpy read of the same windows from a
  ``np.memmap`` of each shard (one fancy index per shard, or one slice per window, whichever is faster
  here); no permutation, no int64 conversion, no tensors.

Then the permutation alone: a scalar lookup at n = 10^10 and the vectorised cost per index.

Run: ``python benchmarks/bench_reader.py [--tokens 64e6] [--shards 4] [--seq 1024] [--batch 64]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from baton.data.manifest import FORMAT, MANIFEST, corpus_fingerprint  # noqa: E402
from baton.data.permutation import Permutation  # noqa: E402
from baton.data.reader import WindowDataset  # noqa: E402
from baton.data.shards import HEADER_SIZE, write_shard  # noqa: E402


def synthetic_corpus(folder: Path, tokens: int, shards: int, vocab: int = 32000) -> None:
    """Random tokens in the real shard format with a real manifest (the reader does not look at content)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    records = []
    per = tokens // shards
    for i in range(shards):
        name = f"shard-{i:05d}.bin"
        arr = rng.integers(0, vocab, size=per, dtype=np.uint16)
        records.append({"file": name, "sha256": write_shard(folder / name, arr), "tokens": per, "sources": [0]})
    manifest = {"format": FORMAT, "dtype": "uint16", "shards": records, "n_shards": shards,
                "total_tokens": per * shards, "tokenizer": {"sha256": "synthetic", "vocab_size": vocab},
                "fingerprint": corpus_fingerprint(records, "synthetic", "uint16")}
    (folder / MANIFEST).write_text(json.dumps(manifest))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=float, default=64e6)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64, help="windows per read (a global batch)")
    ap.add_argument("--reads", type=int, default=300, help="measured reads per side")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="baton-bench-reader-"))
    try:
        synthetic_corpus(work / "data", int(args.tokens), args.shards)
        L, B = args.seq, args.batch
        ds = WindowDataset(work / "data", L, 1234, 0)
        maps = [np.memmap(work / "data" / f"shard-{i:05d}.bin", dtype="<u2", mode="r", offset=HEADER_SIZE)
                for i in range(args.shards)]
        per = maps[0].size
        for m in maps:  # warm the page cache for both sides
            int(np.asarray(m[:: 2048]).sum())
        span = np.arange(L + 1)

        def bare_fancy(ids: np.ndarray) -> np.ndarray:
            starts = ids * L
            shard, local = np.divmod(starts, per)
            out = np.empty((len(ids), L + 1), dtype=np.uint16)
            inside = local + L + 1 <= per
            for s in np.unique(shard[inside]):
                sel = inside & (shard == s)
                out[sel] = maps[s][local[sel, None] + span]
            for j in np.flatnonzero(~inside):  # the rare window across a shard join
                a = maps[shard[j]][local[j]:]
                out[j] = np.concatenate([a, maps[shard[j] + 1][: L + 1 - a.size]])
            return out

        def bare_slices(ids: np.ndarray) -> np.ndarray:
            out = np.empty((len(ids), L + 1), dtype=np.uint16)
            for j, w in enumerate(ids.tolist()):
                s, lo = divmod(w * L, per)
                if lo + L + 1 <= per:
                    out[j] = maps[s][lo : lo + L + 1]
                else:
                    a = maps[s][lo:]
                    out[j] = np.concatenate([a, maps[s + 1][: L + 1 - a.size]])
            return out

        rng = np.random.default_rng(1)
        first = int(rng.integers(0, ds.n_train * 2))
        x, y = ds.train_batch(first, B)  # correctness first: both sides read the same tokens
        ref = bare_fancy(ds.train_window_ids(first, B))
        assert np.array_equal(x.numpy(), ref[:, :-1]) and np.array_equal(y.numpy(), ref[:, 1:])
        assert np.array_equal(bare_slices(ds.train_window_ids(first, B)), ref)

        # The training pattern: consecutive global batches from a random point (each batch is B windows
        # scattered by the permutation), crossing an epoch boundary on the way. Then random jumps.
        patterns = {"consecutive batches": [first + B * i for i in range(args.reads)],
                    "random jumps": rng.integers(0, ds.n_train * 3, size=args.reads).tolist()}
        print(f"corpus {ds.stream.total:,} tokens in {args.shards} shards; {B} windows of {L} per read, "
              f"{args.reads} reads per side")
        tok = B * (L + 1)
        for label, starts in patterns.items():
            times: dict[str, list[float]] = {"reader": [], "bare fancy index": [], "bare slices": []}
            fresh = WindowDataset(work / "data", L, 1234, 0)
            for s in starts:
                ids = fresh.train_window_ids(s, B)
                t = time.perf_counter()
                fresh.train_batch(s, B)
                times["reader"].append(time.perf_counter() - t)
                t = time.perf_counter()
                bare_fancy(ids)
                times["bare fancy index"].append(time.perf_counter() - t)
                t = time.perf_counter()
                bare_slices(ids)
                times["bare slices"].append(time.perf_counter() - t)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"{label}:")
            for k, v in med.items():
                print(f"  {k:18s} {v * 1e3:8.3f} ms per read  {tok / v / 1e6:9.1f} M tokens/s")
            bare = min(med["bare fancy index"], med["bare slices"])
            print(f"RATIO {label}: reader / best bare = {bare / med['reader']:.2f} (target >= 0.50)")

        p = Permutation(10**10, 1234, 3)
        idx = rng.integers(0, 10**10, size=20000)
        t = time.perf_counter()
        for i in idx.tolist():
            p[i]
        scalar = (time.perf_counter() - t) / idx.size
        t = time.perf_counter()
        p.take(idx)
        vec = (time.perf_counter() - t) / idx.size
        print(f"permutation at n = 10^10: scalar lookup {scalar * 1e6:.2f} µs, vectorised {vec * 1e9:.0f} ns per index")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
