"""`baton prepare` throughput against the bare tokenizer's batch encoding of the same text (target >= 0.7).

Both sides run in this one process, interleaved round by round, on the same documents (functions and
classes of the running Python's standard library, written as a JSONL file) with the same tokenizer:

- bare: ``Tokenizer.encode_batch`` and ``encode_batch_fast`` on the documents already in memory, in one
  call for all of them, and ``encode_batch_fast`` in calls of 256 documents (prepare's batch); only the
  calls are timed, and the best of the three is the baseline.
- prepare: the whole of ``baton prepare`` with a given tokenizer: reading and parsing the JSONL, the mix,
  encoding, packing shards, writing and hashing them, the journal and the manifest. Once in this process
  (``data.prepare_workers = 1``: encode_batch on every core from one thread) and once with one worker
  process per core.

Throughput counts the tokens of the text on both sides (prepare's end-of-text tokens are not counted).
Then peak memory of prepare for a corpus and for one four times larger, each in a fresh process: flat
peaks are the bounded-memory claim.

Run: ``python benchmarks/bench_prepare.py [--mb 16] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from baton.config import Config, SourceConfig  # noqa: E402
from baton.data.prepare import prepare  # noqa: E402
from baton.data.tokenize import train_tokenizer  # noqa: E402


def documents(megabytes: float) -> list[str]:
    budget = int(megabytes * (1 << 20))
    out: list[str] = []
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for part in re.split(r"\n(?=def |class )", text):
            # Documents of 100 B to 64 KB: memory then depends on the corpus size alone, which is what the
            # memory runs below measure (a single huge document is held whole and raises the peak by itself).
            if 100 <= len(part) <= 64 << 10:
                out.append(part)
                budget -= len(part.encode())
                if budget <= 0:
                    return out
    return out


def write_jsonl(docs: list[str], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")


def config(src: Path, out: Path, tokenizer: Path, workers: int) -> Config:
    cfg = Config()
    cfg.data.dir = str(out)
    cfg.data.sources = [SourceConfig(kind="jsonl", path=str(src))]
    cfg.data.tokenizer = str(tokenizer)
    cfg.data.shard_tokens = 1 << 20
    cfg.data.prepare_workers = workers
    return cfg


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


MEMORY_CHILD = """
import resource, sys, json
sys.path.insert(0, {root!r})

def peak_kb():
    # VmHWM is this process image's own peak; ru_maxrss would carry the parent's peak across fork + exec.
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

from baton.config import Config, SourceConfig
from baton.data.prepare import prepare
cfg = Config()
cfg.data.dir, cfg.data.tokenizer, cfg.data.shard_tokens = sys.argv[2], sys.argv[3], 1 << 20
cfg.data.sources = [SourceConfig(kind="jsonl", path=sys.argv[1])]
cfg.data.prepare_workers = int(sys.argv[4])
m = prepare(cfg, progress=False)
print(json.dumps([m["total_tokens"], peak_kb()]))
"""


def corpus_args(description: str, mb: float) -> argparse.ArgumentParser:
    """The options every prepare benchmark takes: corpus size, rounds, vocabulary, the memory runs' size."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--mb", type=float, default=mb, help="megabytes of text in the measured corpus")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--memory-mb", type=float, default=4,
                    help="corpus size of the smaller memory run; the larger is 4 times that (0: skip)")
    return ap


def main() -> None:
    args = corpus_args(__doc__.splitlines()[0], mb=16).parse_args()

    from tokenizers import Tokenizer

    work = Path(tempfile.mkdtemp(prefix="baton-bench-prepare-"))
    try:
        docs = documents(args.mb)
        src = work / "docs.jsonl"
        write_jsonl(docs, src)
        tok_path = work / "tokenizer.json"
        train_tokenizer(iter(docs[: max(1, len(docs) // 4)]), args.vocab).save(str(tok_path))
        tok = Tokenizer.from_file(str(tok_path))
        n = cores()
        print(f"corpus: {len(docs):,} documents, {sum(len(d.encode()) for d in docs) / 2**20:.1f} MiB of text; "
              f"vocab {tok.get_vocab_size():,}; {n} cores; tokenizers {__import__('tokenizers').__version__}")

        sides: dict[str, list[float]] = {"bare encode_batch": [], "bare encode_batch_fast": [],
                                         "bare encode_batch_fast x256": [],
                                         "prepare, in-process": [], f"prepare, {n} worker processes": []}
        for r in range(args.rounds):
            for name in sides:
                if name.startswith("bare"):
                    fast = getattr(tok, "encode_batch_fast", None)
                    fn = tok.encode_batch if name.endswith("encode_batch") else fast
                    if fn is None:
                        continue
                    step = 256 if name.endswith("x256") else len(docs)  # one call, or prepare's batch size
                    tokens, dt = 0, 0.0
                    for i in range(0, len(docs), step):
                        t = time.perf_counter()
                        encs = fn(docs[i : i + step], add_special_tokens=False)
                        dt += time.perf_counter() - t
                        tokens += sum(len(e.ids) for e in encs)
                        del encs
                else:
                    workers = 1 if "in-process" in name else n
                    out = work / f"out-{r}-{workers}"
                    t = time.perf_counter()
                    m = prepare(config(src, out, tok_path, workers), force=True, progress=False)
                    dt = time.perf_counter() - t
                    tokens = m["total_tokens"] - sum(s["documents"] for s in m["sources"])
                    shutil.rmtree(out)
                sides[name].append(tokens / dt)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1] / 1e6:.3f}M tok/s" for k, v in sides.items() if v))

        med = {k: statistics.median(v) for k, v in sides.items() if v}
        bare = max(v for k, v in med.items() if k.startswith("bare"))
        print("\nmedian tokens/s of text:")
        for k, v in med.items():
            print(f"  {k:32s} {v / 1e6:8.3f} M")
        for k, v in med.items():
            if k.startswith("prepare"):
                print(f"RATIO {k} / best bare = {v / bare:.2f} (target >= 0.70)")

        if args.memory_mb:
            print("\npeak memory (max RSS of a fresh process running prepare, in-process encoding):")
            for scale in (1, 4):
                part = documents(args.memory_mb * scale)
                path = work / f"mem-{scale}.jsonl"
                write_jsonl(part, path)
                out = subprocess.run([sys.executable, "-c", MEMORY_CHILD.format(root=str(ROOT)), str(path),
                                      str(work / f"mem-out-{scale}"), str(tok_path), "1"],
                                     capture_output=True, text=True, check=True).stdout
                tokens, rss_kb = json.loads(out.strip().splitlines()[-1])
                print(f"  {path.stat().st_size / 2**20:6.1f} MiB JSONL, {tokens:>12,} tokens: "
                      f"peak RSS {rss_kb / 1024:7.1f} MiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
