"""`baton prepare` from a Hub dataset repository against the same files on local disk (target >= 0.8).

One run, sides interleaved round by round, the same Parquet files (functions and classes of the running
Python's standard library, several row groups each, a text column among others) and the same tokenizer:

- local: a ``kind = "parquet"`` source over the files on disk;
- hub, cached: a ``kind = "hub"`` source over the same files served by the local Hub of the tests
  (tests/support/store_hub_server.py, a thread of this process, real ``huggingface_hub`` client), into an
  empty Hub cache each round: listing, downloads, sha256 checks, then reading;
- hub, streaming: the same with ``stream = true`` (each file deleted once read through).

All with 2 encoding worker processes. Throughput is tokens of text per second of the whole prepare. Then
the peak memory of a fresh process streaming from the Hub a corpus and one four times larger: flat peaks
are the bounded-memory claim (files are read a row group at a time).

Run: ``python benchmarks/bench_hub_prepare.py [--mb 8] [--files 8] [--rounds 3]``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench_prepare import corpus_args, documents  # noqa: E402

from baton.config import Config, SourceConfig  # noqa: E402
from baton.data.prepare import prepare  # noqa: E402
from baton.data.tokenize import train_tokenizer  # noqa: E402

WORKERS = 2


def parquet_files(docs: list[str], n_files: int) -> dict[str, bytes]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = {}
    per = -(-len(docs) // n_files)
    for k in range(n_files):
        part = docs[k * per:(k + 1) * per]
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": list(range(len(part))), "text": part}), buf, row_group_size=256)
        out[f"data/train-{k:05d}.parquet"] = buf.getvalue()
    return out


def config(out: Path, tokenizer: Path, source: SourceConfig) -> Config:
    cfg = Config()
    cfg.data.dir = str(out)
    cfg.data.sources = [source]
    cfg.data.tokenizer = str(tokenizer)
    cfg.data.shard_tokens = 1 << 20
    cfg.data.prepare_workers = WORKERS
    return cfg


MEMORY_CHILD = """
import json, sys
sys.path.insert(0, {root!r})

def peak_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

from baton.config import Config, SourceConfig
from baton.data.prepare import prepare
cfg = Config()
cfg.data.dir, cfg.data.tokenizer, cfg.data.shard_tokens, cfg.data.prepare_workers = sys.argv[2], sys.argv[3], 1 << 20, 1
cfg.data.sources = [SourceConfig(kind="hub", repo=sys.argv[1], files="data/*.parquet", stream=True)]
m = prepare(cfg, progress=False)
print(json.dumps([m["total_tokens"], peak_kb()]))
"""


def main() -> None:
    ap = corpus_args(__doc__.splitlines()[0], mb=8)
    ap.add_argument("--files", type=int, default=8, help="Parquet files the corpus is split into")
    args = ap.parse_args()

    from huggingface_hub import constants

    from support.store_hub_server import HubServer

    work = Path(tempfile.mkdtemp(prefix="baton-bench-hub-"))
    server = HubServer(work / "hub").start()
    os.environ.update(HF_ENDPOINT=server.url, HF_TOKEN=server.token, HF_HUB_DISABLE_XET="1")
    try:
        docs = documents(args.mb)
        files = parquet_files(docs, args.files)
        local = work / "local"
        for name, data in files.items():
            (local / name).parent.mkdir(parents=True, exist_ok=True)
            (local / name).write_bytes(data)
        server.put("datasets/bench/corpus", files)
        tok_path = work / "tokenizer.json"
        train_tokenizer(iter(docs[: max(1, len(docs) // 4)]), args.vocab).save(str(tok_path))
        print(f"corpus: {len(docs):,} documents, {sum(len(d.encode()) for d in docs) / 2**20:.1f} MiB of text in "
              f"{len(files)} Parquet files ({sum(map(len, files.values())) / 2**20:.1f} MiB); vocab {args.vocab:,}; "
              f"{WORKERS} encoding workers")

        sides = {
            "local files": SourceConfig(kind="parquet", path=str(local / "data" / "*.parquet")),
            "hub, cached": SourceConfig(kind="hub", repo="bench/corpus", files="data/*.parquet"),
            "hub, streaming": SourceConfig(kind="hub", repo="bench/corpus", files="data/*.parquet", stream=True),
        }
        rates: dict[str, list[float]] = {k: [] for k in sides}
        fingerprints: dict[str, set[str]] = {k: set() for k in sides}
        for r in range(args.rounds):
            for name, source in sides.items():
                slug = name.replace(" ", "").replace(",", "-")
                out, cache = work / f"out-{r}-{slug}", work / f"cache-{r}-{slug}"
                constants.HF_HUB_CACHE = str(cache)  # an empty cache: every file is downloaded this round
                t = time.perf_counter()
                m = prepare(config(out, tok_path, source), force=True, progress=False)
                dt = time.perf_counter() - t
                rates[name].append((m["total_tokens"] - m["sources"][0]["documents"]) / dt)
                fingerprints[name].add(m["fingerprint"])
                shutil.rmtree(out)
                shutil.rmtree(cache, ignore_errors=True)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1] / 1e6:.3f}M tok/s" for k, v in rates.items()))

        assert len({fp for s in fingerprints.values() for fp in s}) == 1, f"the sides differ: {fingerprints}"
        med = {k: statistics.median(v) for k, v in rates.items()}
        print("\nmedian tokens/s of text (same fingerprint on every side and round):")
        for k, v in med.items():
            print(f"  {k:16s} {v / 1e6:8.3f} M")
        for k in ("hub, cached", "hub, streaming"):
            print(f"RATIO {k} / local files = {med[k] / med['local files']:.2f} (target >= 0.80)")
        print(f"requests served by the Hub: {len(server.requests):,}")

        if args.memory_mb:
            print("\npeak memory (max RSS of a fresh process streaming from the Hub, in-process encoding):")
            for scale in (1, 4):
                part = documents(args.memory_mb * scale)
                repo = f"bench/mem-{scale}"
                server.put(f"datasets/{repo}", parquet_files(part, args.files * scale))
                env = {**os.environ, "HF_HUB_CACHE": str(work / f"mem-cache-{scale}")}
                out = subprocess.run([sys.executable, "-c", MEMORY_CHILD.format(root=str(ROOT)), repo,
                                      str(work / f"mem-out-{scale}"), str(tok_path)],
                                     capture_output=True, text=True, check=True, env=env).stdout
                tokens, rss_kb = json.loads(out.strip().splitlines()[-1])
                mib = sum(len(d.encode()) for d in part) / 2**20
                print(f"  {mib:6.1f} MiB of text in {args.files * scale} files, {tokens:>12,} tokens: "
                      f"peak RSS {rss_kb / 1024:7.1f} MiB")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
