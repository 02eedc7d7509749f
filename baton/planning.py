"""Command glue for `baton bench`, `baton plan` and the time budget of `baton train`: flags and config in,
the computations of ``bench``, ``plan`` and ``ledger`` out, printed as tables or JSON."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

from .config import Config
from .errors import BatonError
from .guard import count, finite_float
from .plan import HOUR, PlanInput, iso, parse_count, parse_hours, parse_instant, parse_margin, plan
from .tripwires import apply_tripwires, evaluate_tripwires, parse_tripwire


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
    g = p.add_argument_group("horizon (default: the config's)")
    g.add_argument("--target-tokens", default=None, metavar="N", help="e.g. 1e9, 0.9B, 900M")
    g.add_argument("--steps", default=None, metavar="N", help="horizon in steps instead")
    g.add_argument("--tokens-per-step", default=None, metavar="N", help="e.g. 262144")
    g.add_argument("--start-step", type=count(0), default=None, help="first step to plan (default: the store's pointer)")
    g = p.add_argument_group("rate")
    g.add_argument("--rate", default=None, metavar="TOK/S", help="tokens/s over all ranks")
    g.add_argument("--rate-from", default=None, metavar="BENCH.JSON", help="the rate of a bench's picked cell")
    g.add_argument("--measured-rate", default=None, metavar="TOK/S",
                   help="the rate to check the tripwires against (default: the ledger's last measured rate)")
    g = p.add_argument_group("sessions (default: the config's [budget])")
    g.add_argument("--session-hours", default=None, metavar="H", help="the platform's session limit")
    g.add_argument("--margin", default=None, metavar="M", help="kept free per session: 30%%, 45m, 2.7h")
    g.add_argument("--startup", default=None, metavar="D", help="per session before the first step, e.g. 5m")
    g.add_argument("--ckpt-seconds", type=finite_float(0.0), default=None, metavar="S", help="one checkpoint cycle (default: measured)")
    g.add_argument("--ckpt-every", type=count(0), default=None, metavar="N", help="checkpoint cadence in steps")
    g.add_argument("--gap", default="0", metavar="D", help="between sessions, e.g. 10m")
    g = p.add_argument_group("quota and calendar (default: the config's [budget] and the ledger)")
    g.add_argument("--quota-hours", default=None, metavar="H", help="billed hours per period, e.g. 30")
    g.add_argument("--quota-reset", default=None, metavar="TIME", help="an instant the quota resets at")
    g.add_argument("--quota-period-days", type=finite_float(0.0, lo_open=True), default=None)
    g.add_argument("--used-hours", default=None, metavar="H", help="billed in this period already")
    g.add_argument("--cap-hours", default=None, metavar="H", help="a cap on the run's billed hours")
    g.add_argument("--bill-factor", type=finite_float(0.0), default=None,
                   help="billed hours per wall-clock hour (default: budget.bill_factor, else one per rank)")
    g.add_argument("--start", default=None, metavar="TIME", help="when the first session starts (default now)")
    g.add_argument("--deadline", default=None, metavar="TIME", help="warn when the plan ends after this")
    g = p.add_argument_group("tripwires")
    g.add_argument("--tripwire", action="append", default=None, metavar="'RATE: ACTION'",
                   help="e.g. '5150: target=0.9B' or '7400: micro=8, accum=16' (repeatable)")
    g.add_argument("--seq-len", type=count(1), default=None, help="to check a micro-batch tripwire without a config")
    g.add_argument("--ranks", type=count(1), default=None, help="ranks of the run: the default bill factor, and "
                   "to check a micro-batch tripwire")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")

    p = sub.add_parser("ledger", help="the run's sessions and billed hours against the quota and cap")
    config_args(p)
    p.add_argument("--run", action="append", default=None, metavar="NAME",
                   help="runs in the same store to include (repeatable; default: the config's run)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("status", help="what the store holds: pointer, verified checkpoints, tokens, rate, ETA")
    config_args(p)
    p.add_argument("--json", action="store_true")


# ------------------------------------------------------------------------------------- train clock


def session_clock(cfg: Config, session_start: float | None, session_hours: float | str | None,
                  deadline: str | None) -> tuple[float, float | None]:
    """(start, deadline) of a `baton train`, in epoch seconds. The budget counts from ``session_start``, else
    from this process's start (the platform's clock); the earlier of the two limits wins."""
    from .budget import process_start_time

    started = session_start if session_start is not None else process_start_time()
    hours = parse_hours(session_hours, "--session-hours") if session_hours else cfg.budget.session_hours
    deadlines = []
    if hours:
        if hours <= 0:
            raise BatonError(f"--session-hours must be > 0, got {session_hours}")
        deadlines.append(started + hours * HOUR)
    if deadline:
        deadlines.append(parse_instant(deadline, "--deadline").timestamp())
    return started, (min(deadlines) if deadlines else None)


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
    import torch

    from . import bench
    from .session import _pick_device

    device = _pick_device(cfg.train.device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    attns = args.attn.split(",") if args.attn else ["eager", "sdpa"] + (
        ["flash_attention_2"] if bench.flash_available(device) else [])
    from .config import ATTN_IMPLS

    bad = [a for a in attns if a not in ATTN_IMPLS]
    if bad:
        raise BatonError(f"--attn {','.join(bad)}: not one of {', '.join(ATTN_IMPLS)}")
    seqs = _list(args.seq, int, "--seq") if args.seq else [cfg.data.seq_len]
    if not args.micro and not isinstance(cfg.train.micro_batch, int):
        raise BatonError("train.micro_batch is auto, which `baton train` resolves by probing GPU memory; give the "
                         "micro-batches to measure with --micro (e.g. --micro 4,8,16)")
    micros = _list(args.micro, int, "--micro") if args.micro else [cfg.train.micro_batch]
    if args.ranks < 1 or args.warmup < 0 or args.steps < 1 or min(seqs) < 1 or min(micros) < 1:
        raise BatonError("--ranks, --steps, --seq and --micro must be >= 1 and --warmup >= 0")
    tps = parse_count(args.tokens_per_step, "--tokens-per-step") if args.tokens_per_step else \
        cfg.tokens_per_step // args.ranks
    cap = bench.parse_size(args.mem_cap) if args.mem_cap else None
    target = cfg.train.target_tokens or cfg.total_steps * cfg.tokens_per_step
    from .guard import output_dir

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
    meta = {"device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
            "tokens_per_step": tps, "ranks": args.ranks, "warmup": args.warmup, "steps": args.steps,
            "precision": cfg.train.precision, "params": bench.param_count(cfg.model), "target_tokens": target,
            "picked": chosen.label if chosen else None,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    paths = bench.write_outputs(cells, out, meta, cap, device)
    print(bench.table(cells, device))
    print(f"\nwrote {paths['md']}, {paths['json']} and {paths['png']}")
    if args.pick:
        if chosen is None:
            print("no cell ran within the cap" + ("" if allow_compile else " (compiled cells are not eligible: "
                                                  "baton train does not compile)"))
            return 1
        sets = " ".join(f"--set {o}" for o in bench.overrides(chosen, cfg, tps, args.ranks))
        if tps * args.ranks != cfg.tokens_per_step:
            print(f"note: the bench ran at {tps * args.ranks:,} tokens per step, the config trains "
                  f"{cfg.tokens_per_step:,}; the overrides set the global batch to what was measured")
        print(f"picked {chosen.label}: {chosen.tokens_per_s:,.0f} tok/s, peak {chosen.peak_bytes / bench.MiB:,.1f} "
              f"MiB{f' (cap {cap / bench.MiB:,.0f} MiB)' if cap else ''}")
        print(f"overrides: {sets}")
    return 0


# --------------------------------------------------------------------------------------------- plan


def _ledger_view(cfg: Config | None) -> tuple[list[dict[str, Any]], Any]:
    """(ledger records, store) of the config's run, or ([], None) without a config."""
    if cfg is None:
        return [], None
    from .ledger import read_ledger
    from .store import RetryPolicy, open_store

    try:
        store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
        return read_ledger(store, cfg.run.name)[0], store
    except BatonError as e:  # the plan still works from flags and config; say what it could not use
        print(f"baton: warning: the store is not readable ({e}); planning without the ledger and the pointer",
              file=sys.stderr)
        return [], None


def plan_input(args, cfg: Config | None) -> tuple[PlanInput, dict[str, str], list[dict[str, Any]]]:
    """The planner's input from flags, the config, the ledger and the store; and where each value came from."""
    from . import ledger as L

    records, store = _ledger_view(cfg)
    src: dict[str, str] = {}
    b = cfg.budget if cfg else None
    tps = parse_count(args.tokens_per_step, "--tokens-per-step") if args.tokens_per_step else (
        cfg.tokens_per_step if cfg else None)
    if not tps:
        raise BatonError("plan needs --tokens-per-step (or --config)")
    target = 0
    if args.steps:
        total = parse_count(args.steps, "--steps")
    elif args.target_tokens:
        target = parse_count(args.target_tokens, "--target-tokens")
        total = target // tps
    elif cfg:
        total, target = cfg.total_steps, cfg.train.target_tokens
    else:
        raise BatonError("plan needs --target-tokens or --steps (or --config)")
    if args.rate:
        rate, src["rate"] = float(parse_count(args.rate, "--rate")), "given"
    elif args.rate_from:
        from .bench import rate_from_json

        from .guard import input_file

        rate, src["rate"] = rate_from_json(input_file(args.rate_from, "--rate-from", "give a bench.json written by "
                                                      "`baton bench`"))
    else:
        rate, src["rate"] = L.measured_rate(records)
        if rate is None:
            raise BatonError("plan needs a rate: --rate TOK/S, --rate-from bench.json, or a config whose ledger "
                             "holds a measured session")
    hours = parse_hours(args.session_hours, "--session-hours") if args.session_hours else (b.session_hours if b else 0)
    if not hours:
        raise BatonError("plan needs --session-hours (or budget.session_hours in the config)")
    margin = parse_margin(args.margin, hours) if args.margin else ((b.margin_minutes / 60) if b else 0.0)
    ckpt = None
    if args.ckpt_seconds is not None:
        ckpt, src["ckpt"] = float(args.ckpt_seconds), "given"
    elif b and b.ckpt_seconds:
        ckpt, src["ckpt"] = b.ckpt_seconds, "config"
    else:
        ckpt = L.checkpoint_seconds(records)
        src["ckpt"] = "measured (ledger)" if ckpt is not None else "unknown: 0"
    quota = None
    qh = parse_hours(args.quota_hours, "--quota-hours") if args.quota_hours else (b.quota_hours if b else 0.0)
    reset = parse_instant(args.quota_reset, "--quota-reset") if args.quota_reset else (
        parse_instant(b.quota_reset) if b and b.quota_reset else None)
    period_days = args.quota_period_days or (b.quota_period_days if b else 7.0)
    start = parse_instant(args.start, "--start") if args.start else datetime.now(timezone.utc)
    if qh:
        from .plan import Quota

        quota = Quota(qh, timedelta(days=period_days), reset or start)
    if args.used_hours is not None:
        used, src["used"] = parse_hours(args.used_hours, "--used-hours"), "given"
    elif quota and records:
        used, src["used"] = L.totals(records, quota, now=start).period_hours or 0.0, "ledger"
    else:
        used = 0.0
    cap = parse_hours(args.cap_hours, "--cap-hours") if args.cap_hours else (b.cap_hours if b else 0.0)
    cap_left = (cap - sum(L.billed_hours(r) for r in records)) if cap else None
    start_step = args.start_step
    if start_step is None:
        start_step = 0
        if store is not None:
            from .checkpoint.resume import read_pointer

            try:
                pointer = read_pointer(store, cfg.run.name)
            except BatonError as e:
                raise BatonError(f"{e} (pass --start-step to plan anyway)") from None
            if pointer:
                start_step, src["start_step"] = min(pointer["step"], total), "the store's pointer"
    inp = PlanInput(
        total_steps=total, tokens_per_step=tps, rate=rate, session_hours=hours, margin_hours=margin,
        startup_seconds=_startup(args, b, records, src),
        ckpt_seconds=ckpt or 0.0,
        ckpt_every=args.ckpt_every if args.ckpt_every is not None else (cfg.train.ckpt_every if cfg else 0),
        start_step=start_step, target_tokens=target, quota_hours=qh, quota_period_hours=period_days * 24,
        quota_reset=reset, used_hours=used, cap_left_hours=cap_left,
        # Billed like the ledger: budget.bill_factor, else one per rank (the last session's, or --ranks).
        bill_factor=args.bill_factor or (b.bill_factor if b and b.bill_factor else 0.0)
        or (records[-1].get("bill_factor") if records else 0.0) or float(args.ranks or 1),
        gap_hours=parse_hours(args.gap, "--gap"), start=start,
        deadline=parse_instant(args.deadline, "--deadline") if args.deadline else None)
    return inp, src, records


def _startup(args, b, records: list[dict[str, Any]], src: dict[str, str]) -> float:
    """Seconds per session before the first step: given, configured, else measured by earlier sessions."""
    from . import ledger as L

    if args.startup:
        src["startup"] = "given"
        return parse_hours(args.startup, "--startup") * HOUR
    if b and b.startup_minutes:
        src["startup"] = "config"
        return b.startup_minutes * 60
    seconds, src["startup"] = L.startup_seconds(records)
    return seconds or 0.0


def run_plan(args, cfg: Config | None) -> int:
    from . import ledger as L

    inp, src, records = plan_input(args, cfg)
    p = plan(inp)
    texts = args.tripwire if args.tripwire is not None else (cfg.budget.tripwires if cfg else [])
    wires = [parse_tripwire(t) for t in texts]
    measured, msrc = None, ""
    if args.measured_rate:
        measured, msrc = float(parse_count(args.measured_rate, "--measured-rate")), "given"
    elif wires:
        measured, msrc = L.measured_rate(records)
    results = evaluate_tripwires(wires, measured, inp.tokens_per_step, cfg.train.global_batch if cfg else None,
                                 cfg.data.seq_len if cfg else args.seq_len, args.ranks) if measured else []
    fired_plan = None
    if any(r.fired for r in results):
        fired_input = apply_tripwires(inp, results)
        from dataclasses import replace

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
        from .schedule import plot

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
                  f"{fired_plan.billed_hours:.1f} GPU-hours, ETA {iso(fired_plan.eta)}")
    return 0


def _h(hours: float) -> str:
    return f"{hours:.2f}" if hours >= 1 else f"{hours:.4f}"


def format_plan(p, src: dict[str, str]) -> str:
    i = p.input
    target = i.target_tokens or i.total_steps * i.tokens_per_step
    lines = [
        f"horizon: {i.total_steps:,} steps x {i.tokens_per_step:,} tokens = {i.total_steps * i.tokens_per_step:,} "
        f"tokens" + (f" (target {i.target_tokens:,})" if i.target_tokens else "")
        + (f"; planning from step {i.start_step:,} ({src.get('start_step', 'given')})" if i.start_step else ""),
        f"rate: {i.rate:,.0f} tok/s ({src.get('rate', 'given')}) = {i.step_seconds:.2f} s/step",
        f"{target:,} tokens at {i.rate:,.0f} tok/s = {p.target_hours:.1f} h; the steps left take "
        f"{p.stepping_hours:.1f} h of stepping",
        f"sessions of {i.session_hours:g} h with {_h(i.margin_hours)} h margin = {_h(i.usable_seconds / HOUR)} h "
        f"usable; checkpoint cycle {i.ckpt_seconds:g} s ({src.get('ckpt', 'given')})"
        + (f" every {i.ckpt_every} steps" if i.ckpt_every else " at session ends")
        + (f"; startup {i.startup_seconds / 60:.3g} min ({src.get('startup', 'given')})" if i.startup_seconds
           else ""),
    ]
    if i.quota_hours:
        lines.append(f"quota: {i.quota_hours:g} h per {i.quota_period_hours / 24:g} days, resetting at "
                     f"{iso(i.quota_reset or i.start)}; {i.used_hours:.2f} h used this period "
                     f"({src.get('used', 'none recorded')})")
    lines += ["", "| session | steps | stop_after_steps | start | end | hours | billed h | note |",
              "|---|---|---|---|---|---|---|---|"]
    for s in p.sessions:
        lines.append(f"| {s.index} | {s.start_step:,} → {s.stop_after_steps:,} | {s.stop_after_steps} | {iso(s.start)} "
                     f"| {iso(s.end)} | {_h(s.hours)} | {_h(s.billed_hours)} | {s.note} |")
    lines += ["", f"{len(p.sessions)} sessions, {_h(p.wall_hours)} h wall clock, {_h(p.billed_hours)} GPU-hours "
              f"billed; ETA {iso(p.eta)}"]
    lines += [f"warning: {w}" for w in p.warnings]
    lines.append("each session: baton train -c CONFIG --stop-after-steps <stop_after_steps> "
                 f"--session-hours {i.session_hours:.6g}")
    return "\n".join(lines)
