"""Command glue for `baton bench` and `baton plan`: flags and config in, the computations of ``bench``, ``plan``
(its inputs from ``views.plan``) and the tripwires out, printed as tables or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone

from ..config import Config
from ..errors import BatonError
from ..guard import count
from ..planning.plan import iso_by, parse_count, parse_rate, plan
from ..planning.tripwires import apply_tripwires, evaluate_tripwires, parse_tripwire
from ..views.plan import format_plan, plan_input, plan_options


def add_plan_parsers(sub, config_args) -> None:
    p = sub.add_parser("bench", help="measure tokens/s and peak memory over a grid of configurations")
    config_args(p)
    p.add_argument("--attn", default=None, metavar="LIST",
                   help="attention implementations (default: eager,sdpa, plus flash_attention_2 where available)")
    p.add_argument("--seq", default=None, metavar="LIST", help="sequence lengths (default: data.seq_len)")
    p.add_argument("--micro", default=None, metavar="LIST", help="micro-batches (default: train.micro_batch)")
    p.add_argument("--grad-ckpt", default="off,on", metavar="LIST", help="activation checkpointing: off,on")
    p.add_argument("--compile", default="off", metavar="LIST", help="torch.compile: off,on (default off)")
    p.add_argument("--tokens-per-step", default=None, metavar="N",
                   help="tokens per optimizer step per rank, fixed over the grid (default: the config's / --ranks)")
    p.add_argument("--ranks", type=count(1), default=1, help="ranks of the real run: hours for the target assume N "
                   "ranks at the measured rate each (linear scaling, an upper bound)")
    p.add_argument("--warmup", type=count(0), default=2, help="untimed steps per cell")
    p.add_argument("--steps", type=count(1), default=5, help="timed steps per cell")
    p.add_argument("--mem-cap", default=None, metavar="SIZE",
                   help="memory cap (12GiB, 512MiB): cells over it are recorded as OOM; on CPU it applies to the "
                        "resident memory a cell adds to the process")
    p.add_argument("--out", default=None, help="folder for bench.md, bench.json, bench.png (default <run dir>/bench)")
    p.add_argument("--pick", action="store_true", help="choose the fastest cell under the cap; print its overrides")

    p = sub.add_parser("plan", help="sessions, calendar, GPU-hours and tripwires for a run against a quota")
    config_args(p, required=False)
    plan_options(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")

    p = sub.add_parser("ledger", help="the run's sessions and billed hours against the quota and cap")
    config_args(p)
    p.add_argument("--run", action="append", default=None, metavar="NAME",
                   help="runs in the same store to include (repeatable; default: the config's run and its cooldown "
                        "branches)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("status", help="what the store holds: pointer, verified checkpoints, tokens, rate, ETA")
    config_args(p)
    branch_arg(p)
    p.add_argument("--json", action="store_true")


def branch_arg(p: argparse.ArgumentParser) -> None:
    """--branch of the commands that read a run's store: a cooldown branch of the config's run instead."""
    p.add_argument("--branch", default=None, metavar="NAME",
                   help="the config's cooldown branch NAME (anneal-STEP-TOKENS, as `baton status` lists them) "
                        "instead of the main run")



# -------------------------------------------------------------------------------------------- bench


def _list(text: str, kind: type, what: str) -> list:
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if kind is bool:
            if item.lower() not in ("on", "off", "true", "false", "1", "0"):
                raise BatonError(f"{what}: {item!r} is not on or off")
            out.append(item.lower() in ("on", "true", "1"))
        else:
            try:
                out.append(kind(item))
            except ValueError:
                raise BatonError(f"{what}: {item!r} is not a {kind.__name__}") from None
    if not out:
        raise BatonError(f"{what} is empty")
    return out


def run_bench(args, cfg: Config) -> int:
    from .. import bench
    from ..runtime import cuda
    from ..runtime.device import pick_device

    device = pick_device(cfg.train.device)
    names = args.attn.split(",") if args.attn else ["eager", "sdpa"] + (
        ["flash_attention_2"] if bench.flash_available(device) else [])
    from ..config import ATTN_IMPLS

    bad = [a for a in names if a not in ATTN_IMPLS]
    if bad:
        raise BatonError(f"--attn {','.join(bad)}: not one of {', '.join(ATTN_IMPLS)}")
    attns = [a for n in names for a in ATTN_IMPLS if a == n]  # each name as the model.attn choice it is
    seqs = _list(args.seq, int, "--seq") if args.seq else [cfg.data.seq_len]
    if args.micro:
        micros = _list(args.micro, int, "--micro")
    elif isinstance(cfg.train.micro_batch, int):
        micros = [cfg.train.micro_batch]
    else:
        raise BatonError("train.micro_batch is auto, which `baton train` resolves by probing GPU memory; give the "
                         "micro-batches to measure with --micro (e.g. --micro 4,8,16)")
    if args.ranks < 1 or args.warmup < 0 or args.steps < 1 or min(seqs) < 1 or min(micros) < 1:
        raise BatonError("--ranks, --steps, --seq and --micro must be >= 1 and --warmup >= 0")
    if not args.tokens_per_step and cfg.tokens_per_step % args.ranks:
        raise BatonError(f"the config's {cfg.tokens_per_step:,} tokens per step do not split over --ranks "
                         f"{args.ranks}: give ranks that divide train.global_batch, or --tokens-per-step per rank")
    tps = parse_count(args.tokens_per_step, "--tokens-per-step") if args.tokens_per_step else \
        cfg.tokens_per_step // args.ranks
    if tps < 1:
        raise BatonError(f"tokens per step per rank is {tps}: give --tokens-per-step of at least 1 (per rank)")
    cap = bench.parse_size(args.mem_cap) if args.mem_cap else None
    target = cfg.train.target_tokens or cfg.total_steps * cfg.tokens_per_step
    from ..guard import output_dir

    # Bench results belong to the run (the default is <run dir>/bench); any other place is checked like an output.
    out = output_dir(args.out, "--out", cfg, force=True, own=("the run folder",)) if args.out else cfg.run_dir / "bench"

    def progress(cell):
        rate = f"{cell.tokens_per_s:,.0f} tok/s" if cell.tokens_per_s else cell.reason
        print(f"  {cell.label:<40} {cell.status:<7} {rate}", file=sys.stderr, flush=True)

    cells = bench.run_grid(cfg, attns, seqs, micros, _list(args.grad_ckpt, bool, "--grad-ckpt"),
                           _list(args.compile, bool, "--compile"), tps, device, args.warmup, args.steps, cap,
                           target, args.ranks, progress)
    allow_compile = hasattr(cfg.train, "compile")
    chosen = bench.pick(cells, cap, allow_compile) if args.pick else None
    meta = {"device": str(device) if device.type != "cuda" else cuda.name(device),
            "tokens_per_step": tps, "ranks": args.ranks, "warmup": args.warmup, "steps": args.steps,
            "precision": bench.precision_for(cfg, device), "params": bench.param_count(cfg.model), "target_tokens": target,
            "optimizer": cfg.optim.name, "picked": chosen.label if chosen else None,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    paths = bench.write_outputs(cells, out, meta, cap, device)
    print(bench.table(cells, device))
    print(f"\nwrote {', '.join(str(p) for p in list(paths.values())[:-1])} and {list(paths.values())[-1]}")
    if args.pick:
        if chosen is None:
            print(("no cell ran within the cap" if cap else "no cell ran (see each cell's status above)")
                  + ("" if allow_compile else " (compiled cells are not eligible: baton train does not compile)"))
            return 1
        assert chosen.peak_bytes is not None  # pick() chooses only cells that ran, whose peak was measured
        sets = " ".join(f"--set {o}" for o in bench.overrides(chosen, cfg, tps, args.ranks))
        if tps * args.ranks != cfg.tokens_per_step:
            print(f"note: the bench ran at {tps * args.ranks:,} tokens per step, the config trains "
                  f"{cfg.tokens_per_step:,}; the overrides set the global batch to what was measured")
        print(f"picked {chosen.label}: {chosen.tokens_per_s:,.0f} tok/s, peak {chosen.peak_bytes / bench.MiB:,.1f} "
              f"MiB{f' (cap {cap / bench.MiB:,.0f} MiB)' if cap else ''}")
        print(f"overrides: {sets}")
    return 0


# --------------------------------------------------------------------------------------------- plan


def run_plan(args, cfg: Config | None) -> int:
    from ..planning import ledger as L

    inp, src, records = plan_input(args, cfg)
    p = plan(inp)
    texts = args.tripwire if args.tripwire is not None else (cfg.budget.tripwires if cfg else [])
    wires = [parse_tripwire(t) for t in texts]
    measured, msrc = None, ""
    if args.measured_rate:
        measured, msrc = parse_rate(args.measured_rate, "--measured-rate"), "given"
    elif wires:
        measured, msrc = L.measured_rate(records)
    # Without a config the run's ranks are --ranks, default 1, as for the bill factor: with --seq-len that is
    # enough to check that a micro-batch switch keeps the tokens per step.
    ranks = args.ranks if cfg else (args.ranks or 1)
    results = evaluate_tripwires(wires, measured, inp.tokens_per_step, cfg.train.global_batch if cfg else None,
                                 cfg.data.seq_len if cfg else args.seq_len, ranks,
                                 inp.total_steps) if measured else []
    fired_plan = None
    if any(r.fired for r in results):
        fired_input = apply_tripwires(inp, results)
        from dataclasses import replace

        assert measured is not None  # tripwires are evaluated, and so fire, only with a measured rate
        fired_plan = plan(replace(fired_input, rate=measured))
    if args.json:
        out = p.to_dict() | {"sources": src, "tripwires": [
            {"tripwire": r.wire.describe(), "rate": r.wire.rate, "fired": r.fired, "overrides": r.overrides,
             "problem": r.problem or None} for r in results],
            "measured_rate": measured, "plan_after_tripwires": fired_plan.to_dict() if fired_plan else None}
        print(json.dumps(out, indent=1))
        return 0
    print(format_plan(p, src))
    if cfg is not None:
        from ..model.schedule import plot

        print("\n" + "\n".join(plot(cfg.optim, inp.total_steps)))
    if wires and measured is None:
        print("\ntripwires: no measured rate to check them against (pass --measured-rate, or train a session)")
    if results:
        print(f"\ntripwires, against a measured {measured:,.0f} tok/s ({msrc}):")
        for r in results:
            state = "TRIPPED" if r.fired else "holds"
            print(f"  {r.wire.describe()}: {state}" + (f" -> --set {' --set '.join(r.overrides)}" if r.fired else "")
                  + (f"  [problem: {r.problem}]" if r.problem else ""))
        if fired_plan:
            print(f"  after the tripped actions, at {measured:,.0f} tok/s: {len(fired_plan.sessions)} sessions, "
                  f"{fired_plan.billed_hours:.1f} GPU-hours, ETA {iso_by(fired_plan.eta)}")
    return 0
