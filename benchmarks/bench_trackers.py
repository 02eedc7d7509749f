"""Trackers and periodic validation: step-time ratio with W&B (offline) + TensorBoard logging every step
against metrics.jsonl alone (target <= 1.02), and the cost of one evaluation of the held-out windows.

Both sessions live in this one process on the demo shape (configs/tiny.toml's model and batch, 64
validation windows) and step interleaved (tracked, plain, tracked, plain ...), so both see the same
machine load. Each iteration is the training loop's body as ``baton.loop.train`` runs it: the agreed
boundary check (where a verified push is booked and its rows flushed to W&B), the step, the metrics row
through every configured backend, the checkpoint when due. Both sides checkpoint at the same steps.

Requirements: ``pip install -e '.[wandb,tensorboard]'``. Run: ``python benchmarks/bench_trackers.py``.
W&B runs offline (WANDB_MODE=offline is set here); nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import time

from _perf_common import default_work_dir, machine, median, prepare_data, spread, write_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="measured steps per side")
    ap.add_argument("--warmup", type=int, default=5, help="steps per side not measured")
    ap.add_argument("--evals", type=int, default=5, help="evaluations timed")
    ap.add_argument("--ckpt-every", type=int, default=20, help="checkpoint cadence of both sides")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads of both sides (0: torch's default)")
    ap.add_argument("--work", default=None, help="working folder (default: $TMPDIR/baton-bench)")
    args = ap.parse_args()
    os.environ["WANDB_MODE"] = "offline"
    os.environ.setdefault("WANDB_SILENT", "true")

    from baton.config import load_config
    from baton.loop import track_nonfinite, train_step
    from baton.session import finish as finishing
    from baton.session.core import Session

    work = default_work_dir() if args.work is None else __import__("pathlib").Path(args.work)
    cfg_path = write_config(work, "trackers", shape="tiny", data_dir=work / "data", threads=args.threads)
    prepare_data(cfg_path)
    logging.getLogger("baton").setLevel(logging.WARNING)
    total = args.warmup + args.steps
    common = ["data.val_windows=64", f"train.ckpt_every={args.ckpt_every}", f"train.steps={total + 1}"]
    sides = {}
    for name, backends in (("tracked", '["jsonl","tensorboard","wandb"]'), ("plain", '["jsonl"]')):
        cfg = load_config(cfg_path, [*common, f"run.name=trackers-{name}", f"log.backends={backends}"])
        for d in (cfg.run_dir, work / "store" / cfg.run.name):
            shutil.rmtree(d, ignore_errors=True)
        sides[name] = Session(cfg, resume="never", stop_after=total, progress=False)
    times: dict[str, list[float]] = {name: [] for name in sides}
    # The trackers' own work (log every step, flush at verified checkpoints), timed inside the loop: the
    # part of the ratio that does not depend on how loaded the machine is.
    own: dict[str, float] = {name: 0.0 for name in sides}
    for name, s in sides.items():
        for method in ("log", "verified"):
            inner = getattr(s.trackers, method)

            def timed(*a, _inner=inner, _name=name):
                t = time.perf_counter()
                _inner(*a)
                own[_name] += time.perf_counter() - t

            setattr(s.trackers, method, timed)
    try:
        for step in range(total):
            for name, s in sides.items():
                t0 = time.perf_counter()
                b = s.agree(step)
                assert not (b.push_failed or b.signal or b.out_of_time)
                m = train_step(s, step)
                track_nonfinite(s, m, step)
                s.record(step + 1, m)
                if s.checkpoint_due(step + 1):
                    s.checkpointer.checkpoint(step + 1)
                times[name].append(time.perf_counter() - t0)
        s = sides["plain"]
        evals = [finishing.validate(s, total)["eval_seconds"] for _ in range(args.evals)]
    finally:
        for s in sides.values():
            s.close("benchmark")
    a, b = times["tracked"][args.warmup:], times["plain"][args.warmup:]
    ratio = median(a) / median(b)
    print(f"# trackers, shape tiny: {machine()}")
    print(f"W&B offline + TensorBoard + metrics.jsonl  {spread(a)}, mean {sum(a) / len(a) * 1e3:.2f} ms")
    print(f"metrics.jsonl only                         {spread(b)}, mean {sum(b) / len(b) * 1e3:.2f} ms")
    print(f"median of per-pair ratios {median(sorted(x / y for x, y in zip(a, b))):.4f}; "
          f"ratio of means {sum(a) / sum(b):.4f}")
    print(f"TRACKER STEP RATIO (tracked / plain, medians) = {ratio:.4f}  target <= 1.02  "
          f"{'OK' if ratio <= 1.02 else 'MISSED'}")
    for name in sides:
        print(f"trackers' own work ({name}): {own[name] / total * 1e3:.3f} ms per step on average, "
              f"{own[name] / sum(times[name]):.3%} of the loop's time")
    print(f"one evaluation of 64 validation windows: median {median(evals):.3f} s over {len(evals)} "
          f"({median(evals) / median(b):.2f} training steps)")


if __name__ == "__main__":
    main()
