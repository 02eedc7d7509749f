"""The run's lease: step-time ratio of a session holding it (renewed from its own thread, every write fenced)
against one without it (target <= 1.01), and the store requests it adds per checkpoint cycle (target <= 1).

Both sessions live in this one process on the demo shape (configs/tiny.toml's model and batch) over local
stores and step interleaved (leased, plain, leased, plain ...), so both see the same machine load. Each
iteration is the training loop's body as ``baton.loop.train`` runs it: the agreed boundary check (where the
lease's state is read), the step, the metrics row, the checkpoint when due (pushed in the background: its
pointer roll conditional, its pruning after a read of the lease). The leased side renews far more often
than by default (``--lease-seconds 2``: a renewal every 0.67 s instead of every 20 s), to make any cost
visible. The plain side is the same session with its lease released and its store unwrapped.

Every store call of both sides is counted (the lease's own included): the leased side's count less its
renewals, less the plain side's count, per checkpoint cycle, is what the lease adds to a cycle.

Run: ``python benchmarks/bench_lease.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shutil
import time
from collections import Counter
from typing import Any

from _perf_common import default_work_dir, machine, median, prepare_data, spread, write_config


class Counting:
    """A store that counts the calls made on it (every one a request on a remote store)."""

    CALLS = ("put_file", "put_files", "list", "read_range", "get_file", "delete", "delete_many", "read_text",
             "write_text", "read_versioned", "write_if")

    def __init__(self, inner: Any):
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.hashes_on_write = getattr(inner, "hashes_on_write", False)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in self.CALLS:
            return attr

        def counted(*a: Any, **kw: Any) -> Any:
            self.calls[name] += 1
            return attr(*a, **kw)

        return counted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="measured steps per side")
    ap.add_argument("--warmup", type=int, default=10, help="steps per side not measured")
    ap.add_argument("--ckpt-every", type=int, default=20, help="checkpoint cadence of both sides")
    ap.add_argument("--lease-seconds", type=float, default=2.0, help="the leased side's store.lease_seconds")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads of both sides (0: torch's default)")
    ap.add_argument("--work", default=None, help="working folder (default: $TMPDIR/baton-bench)")
    args = ap.parse_args()

    from baton.config import load_config
    from baton.loop import track_nonfinite, train_step
    from baton.session.core import Session
    from baton.store.lease import FencedStore

    work = default_work_dir() if args.work is None else __import__("pathlib").Path(args.work)
    cfg_path = write_config(work, "lease", shape="tiny", data_dir=work / "data", threads=args.threads)
    prepare_data(cfg_path)
    logging.getLogger("baton").setLevel(logging.WARNING)
    total = args.warmup + args.steps
    common = [f"train.ckpt_every={args.ckpt_every}", f"train.steps={total + 1}",
              f"store.lease_seconds={args.lease_seconds}"]
    sides: dict[str, Session] = {}
    counts: dict[str, Counting] = {}
    for name in ("leased", "plain"):
        cfg = load_config(cfg_path, [*common, f"run.name=lease-{name}"])
        for d in (cfg.run_dir, work / "store" / cfg.run.name):
            shutil.rmtree(d, ignore_errors=True)
        s = Session(cfg, resume="never", stop_after=total, progress=False)
        p = s.parts
        assert p.lease is not None and isinstance(p.store, FencedStore)
        counting = Counting(p.store.inner)
        if name == "leased":
            p.lease.store = counting  # the lease's renewals, reads and the pointer's writes are counted too
            store: Any = FencedStore(counting, p.lease)
            s.parts = dataclasses.replace(p, store=store)
        else:
            p.lease.release()
            s.parts = dataclasses.replace(p, store=counting, lease=None)
        s.checkpointer.parts = s.parts
        sides[name], counts[name] = s, counting
    times: dict[str, list[float]] = {name: [] for name in sides}
    lease = sides["leased"].parts.lease
    assert lease is not None
    renewals0 = lease.record.renewals if lease.record else 0
    try:
        for step in range(total):
            for name, s in sides.items():
                t0 = time.perf_counter()
                b = s.agree(step)
                assert not (b.push_failed or b.signal or b.out_of_time or b.fenced)
                if b.push_done:
                    s.checkpointer.book()
                m = train_step(s, step)
                track_nonfinite(s, m, step)
                s.record(step + 1, m)
                if s.checkpoint_due(step + 1):
                    s.checkpointer.checkpoint(step + 1)
                times[name].append(time.perf_counter() - t0)
        for s in sides.values():
            s.checkpointer.push_outcome(wait=True)
            s.checkpointer.book()
        renewals = (lease.record.renewals if lease.record else 0) - renewals0
        # Counted before the sessions end: the release is one write per session, not per cycle.
        calls = {name: Counter(c.calls) for name, c in counts.items()}
    finally:
        for s in sides.values():
            s.close("benchmark")
    a, b = times["leased"][args.warmup:], times["plain"][args.warmup:]
    ratio = median(a) / median(b)
    cycles = total // args.ckpt_every
    leased_calls = sum(calls["leased"].values()) - renewals
    plain_calls = sum(calls["plain"].values())
    extra = (leased_calls - plain_calls) / cycles
    print(f"# lease, shape tiny: {machine()}")
    print(f"leased (renewed every {args.lease_seconds / 3:.2f} s)  {spread(a)}, mean {sum(a) / len(a) * 1e3:.2f} ms")
    print(f"plain                              {spread(b)}, mean {sum(b) / len(b) * 1e3:.2f} ms")
    print(f"median of per-pair ratios {median(sorted(x / y for x, y in zip(a, b))):.4f}; "
          f"ratio of means {sum(a) / sum(b):.4f}")
    print(f"LEASE STEP RATIO (leased / plain, medians) = {ratio:.4f}  target <= 1.01  "
          f"{'OK' if ratio <= 1.01 else 'MISSED'}")
    print(f"store calls over {cycles} checkpoint cycles: leased {dict(calls['leased'])} ({renewals} of them "
          f"renewals), plain {dict(calls['plain'])}")
    print(f"EXTRA REQUESTS PER CHECKPOINT CYCLE (renewals aside) = {extra:.2f}  target <= 1  "
          f"{'OK' if extra <= 1 else 'MISSED'}")


if __name__ == "__main__":
    main()
