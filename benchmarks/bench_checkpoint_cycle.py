"""The checkpoint cycle against its floor, and training while a push is in flight.

1. cycle / floor (target <= 1.5): the whole ``push_checkpoint`` (hash, upload, listing + ranged read-back,
   pointer write and read-back, prune, retention) of a reference-shape checkpoint (106,194,240 fp32
   parameters: weights + AdamW's two moments, about 1.27 GB of random values) into the local store, against
   the floor measured in the same run on the same bytes: copying them into the same disk (fsync'd) and
   hashing them once, in the same single pass (read a chunk, hash it, write it), the least any verified
   copy must do. Cycle and floor alternate; the median of each is compared.
2. step time with a push in flight / without (target <= 1.10): a small model trains with one torch thread
   while the same checkpoint is pushed in the background by baton's ``Pusher``; its steps are compared
   with steps taken right before, with no push. A push uses at most half the cores for hashing.

Requirements: baton's own (``pip install -e .``). Run: ``python benchmarks/bench_checkpoint_cycle.py``
(``--dir`` picks the disk; ``--params`` shrinks the checkpoint for a quick try).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from baton.checkpoint.cycle import push_checkpoint  # noqa: E402
from baton.checkpoint.pusher import Pusher  # noqa: E402
from baton.config import ModelConfig  # noqa: E402
from baton.model.llama import build_model  # noqa: E402
from baton.store.local import LocalStore  # noqa: E402

REF_PARAMS = 106_194_240
CHUNK = 8 << 20


def make_checkpoint(folder: Path, params: int) -> int:
    """A checkpoint folder as baton writes it, filled with random fp32 values; returns its size in bytes."""
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    half = params // 2
    # Two tensors per file keep peak memory near one file's size.
    save_file({"a": torch.rand(half, generator=g), "b": torch.rand(params - half, generator=g)},
              str(folder / "model.safetensors"))
    save_file({"a::exp_avg": torch.rand(params, generator=g), "a::exp_avg_sq": torch.rand(params, generator=g)},
              str(folder / "optimizer.safetensors"))
    (folder / "state.json").write_text('{"format": "baton-checkpoint-v1", "step": 8}', encoding="utf-8")
    (folder / "metrics.jsonl").write_text('{"step": 1, "loss": 10.8}\n' * 8, encoding="utf-8")
    return sum(p.stat().st_size for p in folder.iterdir())


def floor_once(src: Path, dst: Path) -> float:
    """Copy every file and hash its bytes once, in one pass per file, fsync'd: nothing less is a verified copy."""
    os.sync()  # no earlier writes still draining to disk while the clock runs
    t0 = time.perf_counter()
    dst.mkdir(parents=True)
    for p in sorted(src.iterdir()):
        h = hashlib.sha256()
        with open(p, "rb") as f, open(dst / p.name, "wb") as out:
            while chunk := f.read(CHUNK):
                h.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    seconds = time.perf_counter() - t0
    shutil.rmtree(dst)
    return seconds


def fresh_copy(src: Path, dst: Path) -> Path:
    """The folder a save would leave, fsync'd as baton's save does (push_checkpoint prunes it); not timed."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    for p in dst.iterdir():
        with open(p, "rb") as f:
            os.fsync(f.fileno())
    os.sync()
    return dst


def cycle_once(store: LocalStore, src: Path, work: Path, step: int) -> tuple[float, dict[str, float]]:
    folder = fresh_copy(src, work / f"step-{step}")
    t0 = time.perf_counter()
    res = push_checkpoint(store, "bench", folder, step, {"samples_consumed": step}, "sample", keep_last=2)
    return time.perf_counter() - t0, res.timings


def step_times(model, opt, batches, n: int) -> list[float]:
    out = []
    for i in range(n):
        x = batches[i % len(batches)]
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(input_ids=x).logits.flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(time.perf_counter() - t0)
    return out


def async_ratio(store: LocalStore, src: Path, work: Path, first_step: int) -> tuple[float, float, float, int]:
    torch.set_num_threads(1)
    model = build_model(ModelConfig(n_layers=4, hidden=192, n_heads=6, n_kv_heads=2, ffn=512, vocab_size=4096,
                                    max_seq_len=128), "cpu", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 4096, (4, 64), generator=g) for _ in range(8)]
    step_times(model, opt, batches, 5)  # warm-up
    quiet, busy, pushes = [], [], 0
    for rep in range(2):
        quiet += step_times(model, opt, batches, 40)
        folder = fresh_copy(src, work / f"step-{first_step + rep}")
        pusher = Pusher(background=True)
        pusher.start(first_step + rep, lambda f=folder, s=first_step + rep: push_checkpoint(
            store, "bench", f, s, {"samples_consumed": s}, "sample", keep_last=2))
        while pusher.in_flight:
            busy += step_times(model, opt, batches, 1)
        pusher.wait()
        pushes += 1
    # The median is robust to the odd step that a page-cache flush or another process stretched.
    q, b = statistics.median(quiet), statistics.median(busy)
    return b / q, q, b, len(busy)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temporary folder)")
    ap.add_argument("--params", type=int, default=REF_PARAMS, help="parameters of the checkpoint (reference shape)")
    ap.add_argument("--repeat", type=int, default=3, help="cycles and floors, alternated")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="baton-bench-", dir=args.dir))
    try:
        src = base / "src"
        size = make_checkpoint(src, args.params)
        store = LocalStore(base / "store")
        print(f"checkpoint: {size:,} bytes ({size / 1e9:.2f} GB) in {len(list(src.iterdir()))} files; "
              f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}")
        floors, cycles, parts = [], [], []
        for i in range(args.repeat):
            floors.append(floor_once(src, base / "floor"))
            seconds, timings = cycle_once(store, src, base / "work", 100 + i)
            cycles.append(seconds)
            parts.append(timings)
            print(f"  run {i + 1}: floor {floors[-1]:.2f} s, cycle {seconds:.2f} s "
                  f"({', '.join(f'{k} {v:.2f}' for k, v in timings.items())})")
        floor, cycle = statistics.median(floors), statistics.median(cycles)
        ratio, quiet, busy, n_busy = async_ratio(store, src, base / "work", 200)
        print(f"cycle {cycle:.2f} s / floor {floor:.2f} s = {cycle / floor:.3f}  (target <= 1.5)")
        print(f"step with a push in flight {busy * 1e3:.1f} ms / without {quiet * 1e3:.1f} ms = {ratio:.3f}  "
              f"(target <= 1.10; {n_busy} steps during 2 pushes)")
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
