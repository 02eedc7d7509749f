"""Figure 1: baton's training loop against a bare PyTorch loop, step time ratio (target <= 1.03).

Both sides run in this one process on CPU, interleaved step by step (baton, bare, baton, bare ...):
baton's real ``train()`` drives its steps, and right after each of its steps is recorded, one bare step
runs. So both sides see the same machine load, thread pool and cache pressure.

- baton: ``Session`` + ``train()`` as ``baton train`` runs them: the reader slicing the permutation, the
  LR schedule, accumulation, clipping, non-finite checks, metrics.jsonl every step, the progress bar.
  The time of a baton step is the whole loop iteration (stop check, step, record).
- bare: the same model (same init), the same AdamW parameter groups, the same micro-batches already in
  memory as int64 tensors, the same LR schedule, clipping and one ``loss.item()`` per step.

Requirements: baton's own (``pip install -e .``). Run: ``python benchmarks/bench_step_overhead.py``
(``--shape test`` for the test suite's model, where per-step overhead shows most; ``--profile`` to print
where baton's loop spends time beyond the model).
"""

from __future__ import annotations

import argparse
import logging
import math
import shutil
import time

from _perf_common import default_work_dir, machine, median, prepare_data, spread, write_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="tiny", choices=["tiny", "test"])
    ap.add_argument("--steps", type=int, default=60, help="measured steps per side")
    ap.add_argument("--warmup", type=int, default=5, help="steps per side not measured")
    ap.add_argument("--work", default=None, help="working folder (default: $TMPDIR/baton-bench)")
    ap.add_argument("--profile", action="store_true", help="cProfile baton's loop and print the top entries")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads for both sides (0: torch's default)")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    from baton.config import load_config
    from baton.model import build_model
    from baton.schedule import lr_factor
    from baton.session import Session, adamw
    from baton.train import train

    work = default_work_dir() if args.work is None else __import__("pathlib").Path(args.work)
    run = f"overhead-{args.shape}"
    cfg_path = write_config(work, run, shape=args.shape, data_dir=work / "data", threads=args.threads)
    prepare_data(cfg_path)
    for d in (work / "runs" / run, work / "store" / run):
        shutil.rmtree(d, ignore_errors=True)
    logging.getLogger("baton").setLevel(logging.WARNING)
    cfg = load_config(cfg_path)
    total = args.warmup + args.steps

    s = Session(cfg, resume="never", stop_after=total, progress=True)
    # The bare side: identical model and optimizer, batches materialised before the clock starts.
    model = build_model(cfg.model, "cpu", seed=cfg.train.seed)
    opt = adamw(model, cfg, torch.device("cpu"))
    batches = [[(x.clone(), y.clone()) for x, y in s.micro_batches(step)] for step in range(total)]
    accum = len(batches[0])
    o = cfg.optim

    def bare_step(step: int) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        lr = o.lr * lr_factor(step, cfg.total_steps, o.warmup_steps, o.decay_start)
        for g in opt.param_groups:
            g["lr"] = lr
        for x, y in batches[step]:
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        return time.perf_counter() - t0, time.process_time() - c0

    # Wall time, and the process's CPU time, which leaves out the time spent waiting for a core on a
    # shared machine (it still includes the worker threads' spinning, so it is cleanest with --threads 1).
    baton_times: list[float] = []
    bare_times: list[float] = []
    baton_cpu: list[float] = []
    bare_cpu: list[float] = []
    mark = [0.0, 0.0]
    orig_record = s.record

    def record(step, m):
        orig_record(step, m)
        baton_times.append(time.perf_counter() - mark[0])
        baton_cpu.append(time.process_time() - mark[1])
        wall, cpu = bare_step(step - 1)
        bare_times.append(wall)
        bare_cpu.append(cpu)
        mark[:] = time.perf_counter(), time.process_time()

    s.record = record
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
    try:
        mark[:] = time.perf_counter(), time.process_time()
        if prof:
            prof.enable()
        train(s)
        if prof:
            prof.disable()
        s.record = orig_record
        parts = breakdown(s, total)
    finally:
        s.close()
    # The first baton interval includes the loop's start-up; it is among the warm-up steps.
    b, r = baton_times[args.warmup:], bare_times[args.warmup:]
    pair = sorted(x / y for x, y in zip(b, r))
    ratio = median(b) / median(r)
    print(f"# step overhead, shape {args.shape}: {machine()}")
    print(f"baton loop  {spread(b)}")
    print(f"bare loop   {spread(r)}")
    print(f"median of per-pair ratios {median(pair):.4f}")
    bc, rc = baton_cpu[args.warmup:], bare_cpu[args.warmup:]
    print(f"CPU time per step: baton {median(bc) * 1e3:.2f} ms, bare {median(rc) * 1e3:.2f} ms, "
          f"ratio {median(bc) / median(rc):.4f}")
    print(f"STEP OVERHEAD RATIO (baton / bare, medians) = {ratio:.4f}  target <= 1.03  "
          f"{'OK' if ratio <= 1.03 else 'MISSED'}")
    own = sum(parts.values())
    print("baton's own work per step, outside the model and optimizer (microseconds, median of 200 calls): "
          + ", ".join(f"{k} {v:.0f}" for k, v in parts.items()))
    print(f"  = {own:.0f} us per step, {own / 1e6 / median(r):.2%} of the bare step")
    if prof:
        import pstats

        pstats.Stats(prof).sort_stats("cumulative").print_stats(35)
    if not math.isfinite(ratio):
        raise SystemExit(1)


def breakdown(s, step0: int) -> dict[str, float]:
    """Median cost of each piece of per-step work baton adds around the model, called on its own."""
    import statistics

    from baton.schedule import lr_factor

    m = {"loss": 1.0, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 1e4, "step_seconds": 0.1, "skipped": False}
    pieces = {
        "batches": lambda i: [None for _ in s.micro_batches(step0 + i)],
        "lr": lambda i: lr_factor(step0 + i, s.total_steps, 10, 0.8),
        "record": lambda i: s.record(step0 + i, m),
    }
    if hasattr(s, "at_boundary"):
        pieces["boundary"] = lambda i: s.at_boundary(step0 + i)
    else:
        pieces["stop_check"] = lambda i: s.stop_requested()
    if hasattr(s, "reduce_step"):
        pieces["reduce"] = lambda i: s.reduce_step(1.0)
    out = {}
    for name, fn in pieces.items():
        ts = []
        for i in range(200):
            t0 = time.perf_counter()
            fn(i)
            ts.append(time.perf_counter() - t0)
        out[name] = statistics.median(ts) * 1e6
    return out


if __name__ == "__main__":
    main()
