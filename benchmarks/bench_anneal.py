"""The anytime model: a cooldown branch (`baton anneal`) against the plateau checkpoint it starts from and
against a run that planned its decay for the same number of tokens.

One main run on the wsd schedule (warmup, plateau, linear cooldown over the last 20 % of ``--horizon`` steps) is
trained up to its last branch point, with a verified checkpoint at each of ``--points`` (all on its plateau) and
a validation every ``--eval-every`` steps. At each point N, three models at the same token count
``(N + K) x tokens_per_step`` are compared on the same held-out windows (``baton eval``: the mean of the
windows' mean next-token losses):

- **plateau**: the main run's checkpoint at N, the branch's own starting point (what a quota that ends at N
  leaves without a branch), and, at the same token count, the main run's checkpoint at N + K (still on its
  plateau: what spending the branch's tokens on the main run instead gives);
- **branch**: ``baton anneal --step N --fraction F``: K = F x N more steps from that checkpoint, the learning
  rate decaying linearly from the peak (the data continuing where the main run's would);
- **planned**: a fresh run whose horizon is N + K steps, with the config's own decay (the last 20 % of it):
  what knowing the budget in advance would have given.

Everything runs through baton's own commands (train, anneal, eval) on a local store, in one invocation, the
same model shape, seed, data order and batch geometry throughout; only the schedule differs. Expect the branch
at least 0.1 nat below its plateau checkpoint and within 2 % of the planned run (Hägele et al. 2024: a cooldown of
10-20 % matches a schedule planned for the length); what this CPU shape shows is printed as measured.

Run: ``python benchmarks/bench_anneal.py`` (a few minutes on 2 cores). Writes
``benchmarks/results/anneal.json`` and ``benchmarks/results/anneal.png`` (validation loss against tokens: the
main run, its plateau checkpoints, the branches and the planned runs).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
import time
from pathlib import Path

from _perf_common import ROOT, default_work_dir, loss_figure, machine, prepare_data, write_config


def _quiet(fn, *args, **kwargs):
    """A baton API call without its printed and logged lines (the table is this script's output); they are shown
    when it fails."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):  # the API's log handler is made inside
            return fn(*args, **kwargs)
    except BaseException:
        print(said.getvalue(), file=sys.stderr)
        raise


def bench(args, work: Path) -> dict:
    import baton
    from baton.checkpoint.pointer import read_pointer
    from baton.store import open_store
    from baton.tracking.trackers import read_rows

    cfg_path = write_config(work, "anytime", shape=args.shape, steps=args.horizon, threads=args.threads,
                            global_batch=args.global_batch, micro_batch=args.global_batch)
    prepare_data(cfg_path)
    store_dir = work / "anneal-store"
    ends = {n: n + int(args.fraction * n) for n in args.points}  # K = F x N, as anneal rounds it (F = 0.2: exact)
    stops = sorted({*args.points, *ends.values()})
    common = {"store.url": str(store_dir), "run.local_dir": str(work / "anneal-runs"), "optim.lr": args.lr,
              "optim.warmup_steps": args.warmup, "optim.decay_start": 0.8, "data.val_windows": args.val_windows,
              "store.keep_last": len(stops) + 1, "train.log_every": 1000}
    if store_dir.exists():  # a fresh store: every number below is this invocation's
        import shutil

        shutil.rmtree(store_dir)
        shutil.rmtree(work / "anneal-runs", ignore_errors=True)
    main = baton.load_config(cfg_path, {**common, "run.name": "main", "train.ckpt_every": 0,
                                        "train.eval_every": args.eval_every})
    tps = main.tokens_per_step
    t0 = time.perf_counter()

    # The main run, a session per branch point and per branch end, so each leaves a verified checkpoint there.
    for n in stops:
        _quiet(baton.train, main, stop_after_steps=n, progress=False)
    store = open_store(str(store_dir))
    pointer = read_pointer(store, "main")
    assert pointer is not None and pointer.step == stops[-1]
    rows = read_rows(run_metrics(main))
    main_curve = [(r["step"] * tps, r["val_loss"]) for r in rows if "val_loss" in r]

    out = []
    for n in args.points:
        plateau = _quiet(baton.eval, main, step=n)["heldout"]["loss"]
        summary = _quiet(baton.anneal, main, n, fraction=args.fraction, progress=False)
        branch_cfg = baton.branch(main, summary["branch"])
        k = branch_cfg.total_steps - n
        assert n + k == ends[n]
        same_tokens = _quiet(baton.eval, main, step=n + k)["heldout"]["loss"]
        branch = _quiet(baton.eval, branch_cfg)["heldout"]["loss"]
        planned_cfg = baton.load_config(cfg_path, {**common, "run.name": f"planned-{n + k}",
                                                   "train.steps": n + k})
        _quiet(baton.train, planned_cfg, progress=False)
        planned = _quiet(baton.eval, planned_cfg)["heldout"]["loss"]
        row = {"step": n, "cooldown_steps": k, "tokens": (n + k) * tps, "branch_point_tokens": n * tps,
               "plateau": plateau, "plateau_same_tokens": same_tokens, "branch": branch, "planned": planned,
               "branch_name": summary["branch"], "branch_below_plateau": plateau - branch,
               "branch_below_same_tokens": same_tokens - branch, "branch_vs_planned": (branch - planned) / planned}
        out.append(row)
        print(f"  step {n}: plateau {plateau:.4f} (at step {n + k}: {same_tokens:.4f}), branch ({k} steps) "
              f"{branch:.4f}, planned {n + k}-step run {planned:.4f}", flush=True)
    seconds = time.perf_counter() - t0
    return {"machine": machine(), "load_average": [round(x, 2) for x in os.getloadavg()], "shape": args.shape, "tokens_per_step": tps, "horizon": args.horizon,
            "decay_start": 0.8, "lr": args.lr, "warmup": args.warmup, "fraction": args.fraction,
            "val_windows": args.val_windows, "points": out, "main_curve": main_curve, "seconds": round(seconds, 1)}


def run_metrics(cfg) -> Path:
    return cfg.run_dir / "metrics.jsonl"


def _plot(result: dict, path: Path) -> None:
    with loss_figure(path, f"{result['shape']} shape: cooldown branches from the plateau vs planned decay", size=(8, 4.5), legend=8) as ax:
        toks, vals = zip(*result["main_curve"])
        ax.plot(toks, vals, "-", color="black", lw=1.2, label="main run (wsd, on its plateau)")
        for i, p in enumerate(result["points"]):
            first = i == 0
            ax.plot([p["branch_point_tokens"], p["tokens"]], [p["plateau"], p["plateau_same_tokens"]], "o", color="grey",
                    ms=6, label="plateau checkpoints (branch point, branch end)" if first else None)
            ax.plot([p["branch_point_tokens"], p["tokens"]], [p["plateau"], p["branch"]], "-", color="tab:blue", lw=1.5)
            ax.plot([p["tokens"]], [p["branch"]], "*", color="tab:blue", ms=12,
                    label=f"cooldown branch ({result['fraction']:.0%} of the tokens seen)" if first else None)
            ax.plot([p["tokens"]], [p["planned"]], "x", color="tab:red", ms=9, mew=2,
                    label="run planned for that length (decay over its last 20 %)" if first else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="test", choices=["tiny", "test"])
    ap.add_argument("--points", type=int, nargs="+", default=[100, 200, 400],
                    help="branch points (steps), all on the main run's plateau")
    ap.add_argument("--fraction", type=float, default=0.2, help="each cooldown's share of the tokens seen")
    ap.add_argument("--horizon", type=int, default=625, help="the main run's planned horizon in steps")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--val-windows", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--work", default=None, help="working folder (default: $TMPDIR/baton-bench)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="where the plot and JSON go")
    args = ap.parse_args()
    if sorted(args.points) != args.points or args.points[-1] * (1 + args.fraction) > 0.8 * args.horizon:
        ap.error("--points must ascend, and each with its cooldown lie on the plateau (80 % of --horizon)")
    logging.getLogger("baton").setLevel(logging.WARNING)
    work = default_work_dir() if args.work is None else Path(args.work)
    print(f"# cooldown branches vs plateau vs planned decay: {machine()}", flush=True)
    r = bench(args, work)
    out = Path(args.out)
    (out / "anneal.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "anneal.json").write_text(json.dumps(r, indent=1), encoding="utf-8")
    _plot(r, out / "anneal.png")
    print(f"\n{r['shape']} shape, {r['tokens_per_step']} tokens a step, lr {r['lr']:g}, main horizon {r['horizon']} "
          f"steps; cooldown {r['fraction']:.0%} of the tokens seen; {r['val_windows']} held-out windows; "
          f"{r['seconds']} s (load average {', '.join(map(str, r['load_average']))})\n")
    print("| branch point N | cooldown K | tokens at N + K | plateau ckpt at N | plateau ckpt at N + K | branch | "
          "planned decay | branch below ckpt N | branch below ckpt N + K | branch vs planned |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in r["points"]:
        print(f"| {p['step']} | {p['cooldown_steps']} | {p['tokens']:,} | {p['plateau']:.4f} | "
              f"{p['plateau_same_tokens']:.4f} | {p['branch']:.4f} | {p['planned']:.4f} | "
              f"{p['branch_below_plateau']:.3f} nat | {p['branch_below_same_tokens']:.3f} nat | "
              f"{p['branch_vs_planned']:+.2%} |")
    ok_gap = all(p["branch_below_plateau"] >= 0.1 for p in r["points"])
    ok_planned = all(abs(p["branch_vs_planned"]) <= 0.02 for p in r["points"])
    print(f"\nbranch >= 0.1 nat below its plateau checkpoint: {'yes' if ok_gap else 'NO'} at every point; "
          f"within 2 % of the planned decay: {'yes' if ok_planned else 'NO'} at every point")
    print(f"plot: {out / 'anneal.png'}; numbers: {out / 'anneal.json'}")


if __name__ == "__main__":
    main()
