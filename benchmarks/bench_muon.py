"""Muon against AdamW: tokens for Muon to reach AdamW's final validation loss / AdamW's tokens (target <= 0.8),
and the optimizer step's time ratio.

Every run trains the same model (same initial weights, seed 0) on the same windows in the same order (the
reader's permutation, read once before the clock starts), with the same tokens per step, the same schedule
(wsd: warmup, plateau, linear cooldown over the last 20 %), clipping at 1.0 and fp32 on CPU; only the
optimizer differs, built by ``baton.model.optimizer.build_optimizer`` as ``baton train`` builds it, the
learning rate set by ``set_lr`` as the loop sets it. The validation loss is the mean over the held-out
windows, every ``--eval-every`` steps and at the end.

Each optimizer runs at its best learning rate from a grid: AdamW at ``--adamw-lrs``; Muon at ``--muon-lrs``
for its matrices, with the embeddings, head and norms on AdamW at AdamW's best lr. A best at the edge of its
grid says only that the optimum lies beyond it, and a baseline tuned that way flatters the other side: each
grid is extended past the edge holding its best (by the grid's own ratio) until the best is interior, up to
``--max-widen`` more runs per optimizer (the result says when that was not enough). The runs of a grid step in
lockstep (one step of each in turn), so the machine's load falls on all of them alike; the best AdamW run is
repeated beside the first Muon grid, which times both optimizer steps side by side (the median of
``optimizer.step()`` per run; Muon's step time does not depend on its lr) and checks that a run repeats
exactly.

Tokens to target: the first evaluation at which Muon's validation loss is at or below AdamW's final one,
in tokens, over AdamW's tokens for its whole run. Muon's curve is read during its own plateau, before its
cooldown, so the ratio is conservative. CPU shapes are small: what holds there need not hold at 100 M
parameters and a billion tokens.

Run: ``python benchmarks/bench_muon.py`` (both shapes; ``--shape tiny`` or ``--shape test`` for one).
``--step-time``: only the step times, AdamW, baton's Muon and torch's per-matrix Muon side by side
(``benchmarks/results/muon_step_time_<shape>.json``).
Writes ``benchmarks/results/muon_<shape>.png`` (validation loss against tokens, every run) and
``benchmarks/results/muon_<shape>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import math
import statistics
import time
from pathlib import Path

from _perf_common import ROOT, default_work_dir, loss_figure, machine, prepare_data, write_config

# Steps per shape: the tiny shape's steps cost about 40 times the test shape's.
DEFAULT_STEPS = {"tiny": 100, "test": 300}


class Run:
    """One model and optimizer stepping through the shared batches."""

    def __init__(self, label: str, cfg, steps: int, per_matrix: bool = False):
        import torch

        from baton.model.llama import build_model
        from baton.model.optimizer import build_optimizer

        self.label, self.cfg, self.steps = label, cfg, steps
        self.model = build_model(cfg.model, "cpu", seed=cfg.train.seed)
        self.opt = per_matrix_muon(self.model, cfg) if per_matrix else build_optimizer(self.model, cfg,
                                                                                         torch.device("cpu"))
        self.curve: list[tuple[int, float]] = []  # (tokens, validation loss)
        self.step_times: list[float] = []  # optimizer.step() alone
        self.whole_times: list[float] = []  # the whole step: forward, backward, clipping, optimizer, zero_grad

    def step(self, step: int, micro: list) -> None:
        import torch

        from baton.model.optimizer import set_lr
        from baton.model.schedule import factor_for

        o = self.cfg.optim
        t_start = time.perf_counter()
        set_lr(self.opt, o, factor_for(o, step, self.steps))
        for x, y in micro:
            logits = self.model(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), y)
            (loss / len(micro)).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), o.grad_clip)
        t0 = time.perf_counter()
        self.opt.step()
        self.step_times.append(time.perf_counter() - t0)
        self.opt.zero_grad(set_to_none=True)
        self.whole_times.append(time.perf_counter() - t_start)

    def evaluate(self, tokens: int, vx, vy) -> float:
        import torch

        from baton.evaluate.heldout import window_losses

        with torch.no_grad():
            val = float(torch.cat([window_losses(self.model, vx[i:i + 16], vy[i:i + 16], contextlib.nullcontext)
                                   for i in range(0, len(vx), 16)]).mean())
        self.curve.append((tokens, val))
        return val

    @property
    def final(self) -> float:
        return self.curve[-1][1]


def per_matrix_muon(model, cfg):
    """The optimizer ``optim.name = "muon"`` built with torch.optim.Muon itself (one Newton-Schulz per matrix), as
    baton built it before its Muon batched them: the step-time baseline."""
    import torch

    from baton.model.optimizer import Combined, adamw, muon_split

    o = cfg.optim
    names, _ = muon_split(model)
    params = dict(model.named_parameters())
    rest = [p for n, p in params.items() if n not in set(names)]
    hidden = torch.optim.Muon([params[n] for n in names], lr=o.muon_lr, weight_decay=o.muon_weight_decay,
                              momentum=o.muon_momentum, nesterov=o.muon_nesterov, ns_steps=o.muon_ns_steps,
                              adjust_lr_fn=o.muon_adjust_lr)
    return Combined(adamw(model, cfg, torch.device("cpu"), rest), hidden)


def step_time(shape: str, args, work: Path) -> dict:
    """Muon's step time against AdamW's, side by side: the same model, batches and schedule; AdamW, baton's Muon
    (Newton-Schulz batched over same-shaped matrices) and torch's Muon (one matrix at a time) step in lockstep,
    each run's whole step and its ``optimizer.step()`` timed; medians after ``--step-warmup`` steps."""
    from baton.config import load_config
    from baton.data.reader import WindowDataset, micro_batches

    steps = args.step_time_steps + args.step_warmup
    cfg_path = write_config(work, f"muon-time-{shape}", shape=shape, steps=steps, data_dir=work / "data",
                            threads=args.threads)
    prepare_data(cfg_path)
    base = load_config(cfg_path)
    data = WindowDataset(base.data.dir, base.data.seq_len, base.data.shuffle_seed, base.data.val_windows)
    gb, mb = base.train.global_batch, int(base.train.micro_batch)
    batches = [list(micro_batches(data.rank_rows(s, gb, 0, 1), mb)) for s in range(steps)]

    def cfg_for(name: str):
        c = copy.deepcopy(base)
        c.optim.name = name
        c.validate()
        return c

    runs = {"adamw": Run("adamw", cfg_for("adamw"), steps), "muon": Run("muon", cfg_for("muon"), steps),
            "muon, per matrix": Run("muon, per matrix", cfg_for("muon"), steps, per_matrix=True)}
    for step in range(steps):
        for r in runs.values():
            r.step(step, batches[step])
    w = args.step_warmup
    whole = {k: statistics.median(r.whole_times[w:]) for k, r in runs.items()}
    opt = {k: statistics.median(r.step_times[w:]) for k, r in runs.items()}
    apart = max(float((a - b).detach().abs().max()) for a, b in zip(runs["muon"].model.parameters(),
                                                              runs["muon, per matrix"].model.parameters()))
    return {"shape": shape, "steps_measured": args.step_time_steps, "step_ms": {k: v * 1e3 for k, v in whole.items()},
            "optimizer_step_ms": {k: v * 1e3 for k, v in opt.items()},
            "step_ratio": whole["muon"] / whole["adamw"],
            "step_ratio_per_matrix": whole["muon, per matrix"] / whole["adamw"],
            "optimizer_ratio_batched_over_per_matrix": opt["muon"] / opt["muon, per matrix"],
            "max_weight_difference_batched_vs_per_matrix": apart}


def lockstep(runs: list[Run], batches: list[list], vx, vy, eval_every: int, tokens_per_step: int) -> None:
    for r in runs:
        r.evaluate(0, vx, vy)
    n = len(batches)
    for step in range(n):
        for r in runs:
            r.step(step, batches[step])
        if (step + 1) % eval_every == 0 or step + 1 == n:
            for r in runs:
                r.evaluate((step + 1) * tokens_per_step, vx, vy)


def beyond_edge(finals: dict[float, float]) -> float | None:
    """The learning rate to try next: one grid step past the edge that holds the best final loss (a diverged
    run counts as worst), or None when the best is interior. The step is the grid's smallest ratio between
    neighbours (2 for a single point)."""
    lrs = sorted(finals)
    best = min(lrs, key=lambda lr: finals[lr] if math.isfinite(finals[lr]) else math.inf)
    ratio = min((b / a for a, b in zip(lrs, lrs[1:])), default=2.0)
    if best == lrs[0]:
        return lrs[0] / ratio
    if best == lrs[-1]:
        return lrs[-1] * ratio
    return None


def widened(finals: dict[float, float], evaluate, max_widen: int) -> bool:
    """Extend ``finals`` ({lr: final loss} of the grid run so far) with ``evaluate(lr)`` past the edge holding
    the best until the best is interior; False when ``max_widen`` more runs did not get there."""
    for _ in range(max_widen):
        lr = beyond_edge(finals)
        if lr is None:
            return True
        finals[lr] = evaluate(lr)
    return beyond_edge(finals) is None


def tokens_to_reach(curve: list[tuple[int, float]], target: float) -> int | None:
    return next((tok for tok, val in curve if val <= target), None)


def bench_shape(shape: str, args, work: Path, out: Path) -> dict:
    from baton.config import load_config
    from baton.data.reader import WindowDataset, micro_batches

    steps = args.steps or DEFAULT_STEPS[shape]
    cfg_path = write_config(work, f"muon-{shape}", shape=shape, steps=steps, data_dir=work / "data",
                            threads=args.threads)
    prepare_data(cfg_path)
    base = load_config(cfg_path)
    base.optim.warmup_steps = max(1, steps // 20)
    base.data.val_windows = args.val_windows
    data = WindowDataset(base.data.dir, base.data.seq_len, base.data.shuffle_seed, base.data.val_windows)
    gb, mb = base.train.global_batch, int(base.train.micro_batch)
    batches = [list(micro_batches(data.rank_rows(s, gb, 0, 1), mb)) for s in range(steps)]
    vx, vy = data.windows(data.val_window_ids())
    tps = gb * base.data.seq_len

    def cfg_for(name: str, lr: float, muon_lr: float | None = None):
        c = copy.deepcopy(base)
        c.optim.name, c.optim.lr = name, lr
        if muon_lr is not None:
            c.optim.muon_lr = muon_lr
        c.validate()
        return c

    def alone(run: Run) -> float:
        lockstep([run], batches, vx, vy, args.eval_every, tps)
        return run.final

    t0 = time.perf_counter()
    adamw = {lr: Run(f"adamw lr {lr:g}", cfg_for("adamw", lr), steps) for lr in args.adamw_lrs}
    lockstep(list(adamw.values()), batches, vx, vy, args.eval_every, tps)

    def more_adamw(lr: float) -> float:
        adamw[lr] = Run(f"adamw lr {lr:g}", cfg_for("adamw", lr), steps)
        return alone(adamw[lr])

    adamw_interior = widened({lr: r.final for lr, r in adamw.items()}, more_adamw, args.max_widen)
    best_a = min(adamw.values(), key=lambda r: r.final if math.isfinite(r.final) else math.inf)
    a_lr = best_a.cfg.optim.lr
    again = Run(f"adamw lr {a_lr:g} (repeat)", cfg_for("adamw", a_lr), steps)
    muon = {m: Run(f"muon lr {m:g} (adamw part {a_lr:g})", cfg_for("muon", a_lr, m), steps) for m in args.muon_lrs}
    timed = next(iter(muon.values()))  # stepped beside the repeat: the step times compared
    lockstep([again, *muon.values()], batches, vx, vy, args.eval_every, tps)

    def more_muon(m: float) -> float:
        muon[m] = Run(f"muon lr {m:g} (adamw part {a_lr:g})", cfg_for("muon", a_lr, m), steps)
        return alone(muon[m])

    muon_interior = widened({m: r.final for m, r in muon.items()}, more_muon, args.max_widen)
    seconds = time.perf_counter() - t0
    best_m = min(muon.values(), key=lambda r: r.final if math.isfinite(r.final) else math.inf)

    target = best_a.final
    reached = tokens_to_reach(best_m.curve, target)
    total = steps * tps
    ratio = reached / total if reached is not None else math.inf
    step_ratio = statistics.median(timed.step_times) / statistics.median(again.step_times)
    result = {
        "shape": shape, "steps": steps, "tokens_per_step": tps, "tokens": total, "eval_every": args.eval_every,
        "val_windows": args.val_windows, "seconds": round(seconds, 1),
        "adamw_lrs": sorted(adamw), "muon_lrs": sorted(muon),
        "adamw_best_interior": adamw_interior, "muon_best_interior": muon_interior,
        "best_adamw_lr": a_lr, "best_muon_lr": best_m.cfg.optim.muon_lr,
        "adamw_final_val": target, "muon_final_val": best_m.final,
        "muon_tokens_to_adamw_final": reached, "tokens_ratio": ratio,
        "optimizer_step_ms": {"adamw": statistics.median(again.step_times) * 1e3,
                              "muon": statistics.median(timed.step_times) * 1e3},
        "optimizer_step_ratio": step_ratio,
        "repeat_exact": again.curve == best_a.curve,
        "finals": {r.label: r.final for r in [*_by_lr(adamw), *_by_lr(muon)]},
        "curves": {r.label: r.curve for r in [*_by_lr(adamw), *_by_lr(muon)]},
    }
    _plot(result, out / f"muon_{shape}.png", best_a.label, best_m.label)
    (out / f"muon_{shape}.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def _by_lr(runs: dict[float, Run]) -> list[Run]:
    return [runs[lr] for lr in sorted(runs)]


def _plot(result: dict, path: Path, best_a: str, best_m: str) -> None:
    title = f"{result['shape']} shape: tokens to AdamW's final loss, Muon / AdamW = {result['tokens_ratio']:.2f}"
    with loss_figure(path, title, size=(7, 4.2), legend=7) as ax:
        for label, curve in result["curves"].items():
            toks, vals = zip(*curve[1:])  # the untrained point would squash the scale
            best = label in (best_a, best_m)
            ax.plot(toks, vals, color="tab:blue" if label.startswith("adamw") else "tab:orange",
                    lw=2.0 if best else 0.8, alpha=1.0 if best else 0.5, label=label + (" (best)" if best else ""))
        ax.axhline(result["adamw_final_val"], color="grey", ls=":", lw=0.8)
        if result["muon_tokens_to_adamw_final"]:
            ax.axvline(result["muon_tokens_to_adamw_final"], color="tab:orange", ls=":", lw=0.8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="both", choices=["both", "tiny", "test"])
    ap.add_argument("--steps", type=int, default=0, help=f"steps per run (default: {DEFAULT_STEPS})")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--val-windows", type=int, default=64)
    ap.add_argument("--adamw-lrs", type=float, nargs="+", default=[1e-3, 2e-3, 4e-3, 8e-3])
    ap.add_argument("--muon-lrs", type=float, nargs="+", default=[0.01, 0.02, 0.04, 0.08])
    ap.add_argument("--max-widen", type=int, default=4,
                    help="runs added per optimizer past the edge of its grid while its best lies on that edge")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--step-time", action="store_true",
                    help="only the step times: AdamW, Muon and torch's per-matrix Muon side by side")
    ap.add_argument("--step-time-steps", type=int, default=20, help="measured steps per run (--step-time)")
    ap.add_argument("--step-warmup", type=int, default=3, help="steps per run not measured (--step-time)")
    ap.add_argument("--work", default=None, help="working folder (default: $TMPDIR/baton-bench)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="where the plots and JSON go")
    args = ap.parse_args()
    logging.getLogger("baton").setLevel(logging.WARNING)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    work = default_work_dir() if args.work is None else Path(args.work)
    out = Path(args.out)
    print(f"# Muon vs AdamW: {machine()}")
    if args.step_time:
        for shape in (["tiny", "test"] if args.shape == "both" else [args.shape]):
            r = step_time(shape, args, work)
            print(f"\n## {shape} shape: step time, {r['steps_measured']} steps each, in lockstep (medians)")
            print("| optimizer | whole step ms | optimizer.step() ms |\n|---|---|---|")
            for k, v in r["step_ms"].items():
                print(f"| {k} | {v:.2f} | {r['optimizer_step_ms'][k]:.2f} |")
            print(f"  STEP TIME (Muon / AdamW, medians) = {r['step_ratio']:.3f} (torch's per-matrix Muon: "
                  f"{r['step_ratio_per_matrix']:.3f}); optimizer step, batched / per matrix = "
                  f"{r['optimizer_ratio_batched_over_per_matrix']:.3f}; weights of the two Muons at most "
                  f"{r['max_weight_difference_batched_vs_per_matrix']:.2e} apart")
            out.mkdir(parents=True, exist_ok=True)
            (out / f"muon_step_time_{shape}.json").write_text(json.dumps(r, indent=1), encoding="utf-8")
        return
    for shape in (["tiny", "test"] if args.shape == "both" else [args.shape]):
        r = bench_shape(shape, args, work, out)
        print(f"\n## {shape} shape: {r['steps']} steps x {r['tokens_per_step']} tokens, {r['seconds']} s")
        for label, final in r["finals"].items():
            print(f"  {label:34s} final val loss {final:.4f}")
        print(f"  AdamW best lr {r['best_adamw_lr']:g}: final {r['adamw_final_val']:.4f}; Muon best lr "
              f"{r['best_muon_lr']:g}: final {r['muon_final_val']:.4f}; repeat exact: {r['repeat_exact']}")
        for name in ("adamw", "muon"):
            if not r[f"{name}_best_interior"]:
                print(f"  WARNING: {name}'s best lr is still at the edge of {r[f'{name}_lrs']} after --max-widen "
                      f"{args.max_widen} more runs: its tuning is not done")
        reached = r["muon_tokens_to_adamw_final"]
        print(f"  TOKENS TO ADAMW'S FINAL LOSS (Muon / AdamW) = "
              f"{r['tokens_ratio']:.3f} ({reached if reached is not None else 'not reached'} / {r['tokens']})  "
              f"target <= 0.8  {'OK' if r['tokens_ratio'] <= 0.8 else 'MISSED'}")
        ms = r["optimizer_step_ms"]
        print(f"  OPTIMIZER STEP TIME (Muon / AdamW, medians) = {r['optimizer_step_ratio']:.2f} "
              f"({ms['muon']:.2f} ms / {ms['adamw']:.2f} ms)")
        print(f"  plot: {out / f'muon_{shape}.png'}")


if __name__ == "__main__":
    main()
