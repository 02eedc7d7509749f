"""Figure 1: baton's training loop against a bare PyTorch loop, step time ratio (target <= 1.03).

Both sides run in this one process on CPU, interleaved step by step (baton, bare, baton, bare ...):
baton's real ``train()`` drives its steps, and right after each of its steps is recorded, one bare step
runs. So both sides see the same machine load, thread pool and cache pressure.

- baton: ``Session`` + ``train()`` as ``baton train`` runs them: the reader slicing the permutation, the
  LR schedule, accumulation, clipping, non-finite checks, metrics.jsonl every step, the progress bar.
  The time of a baton step is the whole loop iteration (stop check, step, record).
- bare: the same model (same init), the same AdamW parameter groups, the same micro-batches already in
  memory as int64 tensors, the same LR schedule, clipping and one ``loss.item()`` per step.

The ratio comes from a race where baton's side carries nothing but the hook that interleaves the two; a
second race times baton's own pieces inside its loop (``--no-pieces`` skips it), so the timers' cost never
reaches the headline figure.

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
    ap.add_argument("--no-pieces", action="store_true", help="skip the second race that times baton's pieces")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads for both sides (0: torch's default)")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    from baton.config import load_config
    from baton.loop import train
    from baton.model.llama import build_model
    from baton.model.optimizer import adamw
    from baton.model.schedule import lr_factor
    from baton.session.core import Session

    work = default_work_dir() if args.work is None else __import__("pathlib").Path(args.work)
    run = f"overhead-{args.shape}"
    cfg_path = write_config(work, run, shape=args.shape, data_dir=work / "data", threads=args.threads)
    prepare_data(cfg_path)
    logging.getLogger("baton").setLevel(logging.WARNING)
    cfg = load_config(cfg_path)
    total = args.warmup + args.steps

    def race(pieces: bool, prof=None) -> tuple[list[float], list[float], list[float], list[float], Parts | None]:
        """One interleaved race of baton's loop against the bare loop, from fresh weights and an empty run.
        ``pieces``: baton's own work timed piece by piece too (the timers' cost then lands on baton's side)."""
        for d in (work / "runs" / run, work / "store" / run):
            shutil.rmtree(d, ignore_errors=True)
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
        parts = instrument(s) if pieces else None  # per step, the time inside each piece of baton's own work
        orig_record = s.record

        def record(step, m):
            if parts is not None:
                t = time.perf_counter()
                orig_record(step, m)
                parts.add("record", time.perf_counter() - t)
                parts.end_step()
            else:
                orig_record(step, m)
            baton_times.append(time.perf_counter() - mark[0])
            baton_cpu.append(time.process_time() - mark[1])
            wall, cpu = bare_step(step - 1)
            bare_times.append(wall)
            bare_cpu.append(cpu)
            mark[:] = time.perf_counter(), time.process_time()

        s.record = record
        try:
            mark[:] = time.perf_counter(), time.process_time()
            if prof:
                prof.enable()
            train(s)
            if prof:
                prof.disable()
        finally:
            s.close()
        # The first baton interval includes the loop's start-up; it is among the warm-up steps.
        w = args.warmup
        return baton_times[w:], bare_times[w:], baton_cpu[w:], bare_cpu[w:], parts

    # The ratio from a race with nothing but the interleaving hook on baton's side; the pieces from a second,
    # instrumented race (each timer costs a little, charged to baton: that race's ratio is printed beside them).
    b, r, bc, rc, _ = race(pieces=False)
    pair = sorted(x / y for x, y in zip(b, r))
    ratio = median(b) / median(r)
    print(f"# step overhead, shape {args.shape}: {machine()}")
    print(f"baton loop  {spread(b)}")
    print(f"bare loop   {spread(r)}")
    print(f"median of per-pair ratios {median(pair):.4f}")
    print(f"CPU time per step: baton {median(bc) * 1e3:.2f} ms, bare {median(rc) * 1e3:.2f} ms, "
          f"ratio {median(bc) / median(rc):.4f}")
    print(f"STEP OVERHEAD RATIO (baton / bare, medians) = {ratio:.4f}  target <= 1.03  "
          f"{'OK' if ratio <= 1.03 else 'MISSED'}")
    if not args.no_pieces:
        prof = None
        if args.profile:
            import cProfile

            prof = cProfile.Profile()
        b2, r2, _, _, parts = race(pieces=True, prof=prof)
        assert parts is not None
        per = parts.medians(args.warmup)
        own = parts.median_total(args.warmup)
        print(f"baton's own work per step, timed inside the loop of a second race (its ratio "
              f"{median(b2) / median(r2):.4f}), median microseconds: "
              + ", ".join(f"{k} {v * 1e6:.0f}" for k, v in per.items()))
        print(f"  = {own * 1e6:.0f} us per step (median of the per-step sums), {own / median(r2):.2%} of the bare "
              f"step; measured baton - bare = {(median(b2) - median(r2)) * 1e6:.0f} us")
        if prof:
            import pstats

            pstats.Stats(prof).sort_stats("cumulative").print_stats(35)
    if not math.isfinite(ratio):
        raise SystemExit(1)


class Parts:
    """Seconds spent inside each instrumented piece, summed per step."""

    def __init__(self):
        self.now: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []

    def add(self, name: str, dt: float) -> None:
        self.now[name] = self.now.get(name, 0.0) + dt

    def end_step(self) -> None:
        self.steps.append(self.now)
        self.now = {}

    def medians(self, skip: int) -> dict[str, float]:
        names = sorted({k for st in self.steps for k in st})
        return {k: median([st.get(k, 0.0) for st in self.steps[skip:]]) for k in names}

    def median_total(self, skip: int) -> float:
        return median([sum(st.values()) for st in self.steps[skip:]])


def instrument(s) -> Parts:
    """Wrap the session's per-step work around the model (reading the batch, the step-boundary decision,
    the cross-rank reduction) in timers; the loop itself is untouched. A wrapper costs about a microsecond,
    which lands on baton's side."""
    parts = Parts()

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                parts.add(name, time.perf_counter() - t)
        return wrapper

    def timed_gen(name, fn):
        def wrapper(*a, **k):
            it = iter(fn(*a, **k))
            while True:
                t = time.perf_counter()
                try:
                    item = next(it)
                except StopIteration:
                    parts.add(name, time.perf_counter() - t)
                    return
                parts.add(name, time.perf_counter() - t)
                yield item
        return wrapper

    s.micro_batches = timed_gen("batches", s.micro_batches)
    for name in ("agree", "reduce_step"):
        if hasattr(s, name):
            setattr(s, name, timed(name, getattr(s, name)))
    return parts


if __name__ == "__main__":
    main()
