"""The plan's inputs, read from flags, the config, the ledger and the store (and where each value came from),
and the plan as the table ``baton plan`` prints; ``baton.plan`` returns both."""

from __future__ import annotations

import math
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

from ..config import Config
from ..errors import BatonError
from ..guard import count, finite_float
from ..planning import ledger as L
from ..planning.plan import (
    HOUR,
    PlanInput,
    iso,
    iso_by,
    parse_count,
    parse_hours,
    parse_instant,
    parse_margin,
    parse_rate,
)


def plan_options(p) -> None:
    """The flags of the plan (``baton plan``; ``baton.plan``'s keywords), each overriding the config's value."""
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
    g.add_argument("--session-hours", default=None, metavar="H",
                   help="the platform's session limit: 12h, 90m, or a SLURM time limit such as 2-00:00:00")
    g.add_argument("--margin", default=None, metavar="M", help="kept free per session: 30%%, 45m, 2.7h")
    g.add_argument("--startup", default=None, metavar="D", help="per session before the first step, e.g. 5m")
    g.add_argument("--ckpt-seconds", type=finite_float(0.0), default=None, metavar="S",
                   help="one checkpoint cycle (default: measured)")
    g.add_argument("--ckpt-every", type=count(0), default=None, metavar="N", help="checkpoint cadence in steps")
    g.add_argument("--ckpt-minutes", default=None, metavar="M|auto",
                   help="timed checkpoint cadence (default: budget.ckpt_minutes); auto: chosen from the measured cycle "
                        "and the ledger's interruptions")
    g.add_argument("--gap", default="0", metavar="D", help="between sessions, e.g. 10m")
    g = p.add_argument_group("quota and calendar (default: the config's [budget] and the ledger)")
    g.add_argument("--quota-hours", default=None, metavar="H", help="billed hours per period, e.g. 30")
    g.add_argument("--quota-reset", default=None, metavar="TIME", help="an instant the quota resets at")
    g.add_argument("--quota-period-days", type=finite_float(1 / 1440), default=None,
                   help="length of a quota period, a minute to a century (default: budget.quota_period_days, or 7)")
    g.add_argument("--used-hours", default=None, metavar="H", help="billed in this period already")
    g.add_argument("--cap-hours", default=None, metavar="H", help="a cap on the run's billed hours")
    g.add_argument("--bill-factor", type=finite_float(0.0, lo_open=True), default=None,
                   help="billed hours per wall-clock hour (default: budget.bill_factor, else one per rank)")
    g.add_argument("--start", default=None, metavar="TIME", help="when the first session starts (default now)")
    g.add_argument("--deadline", default=None, metavar="TIME", help="warn when the plan ends after this")
    g = p.add_argument_group("tripwires")
    g.add_argument("--tripwire", action="append", default=None, metavar="'RATE: ACTION'",
                   help="e.g. '5150: target=0.9B' or '7400: micro=8, accum=16' (repeatable)")
    g.add_argument("--seq-len", type=count(1), default=None, help="to check a micro-batch tripwire without a config")
    g.add_argument("--ranks", type=count(1), default=None, help="ranks of the run: the default bill factor, and "
                   "to check a micro-batch tripwire")


def _ledger_view(cfg: Config | None) -> tuple[list[L.LedgerRecord], Any]:
    """(ledger records, store) of the config's run, or ([], None) without a config."""
    if cfg is None:
        return [], None
    from ..planning.ledger import read_run_ledgers
    from ..store import RetryPolicy, open_store

    try:
        store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
        return read_run_ledgers(store, cfg.run.name)[0], store  # the cooldown branches' sessions bill the run too
    except BatonError as e:  # the plan still works from flags and config; say what it could not use
        print(f"baton: warning: the store is not readable ({e}); planning without the ledger and the pointer",
              file=sys.stderr)
        return [], None


def plan_input(args, cfg: Config | None) -> tuple[PlanInput, dict[str, str], list[L.LedgerRecord]]:
    """The planner's input from flags, the config, the ledger and the store; and where each value came from."""
    from ..planning import ledger as L

    records, store = _ledger_view(cfg)
    src: dict[str, str] = {}
    b = cfg.budget if cfg else None
    tps = parse_count(args.tokens_per_step, "--tokens-per-step") if args.tokens_per_step else (
        cfg.tokens_per_step if cfg else None)
    if not tps:
        raise BatonError("plan needs --tokens-per-step (or --config)")
    target = 0
    if args.steps and args.target_tokens:
        raise BatonError("give the horizon once: --steps or --target-tokens, not both")
    if args.rate and args.rate_from:
        raise BatonError("give the rate once: --rate or --rate-from, not both")
    if args.steps:
        total = parse_count(args.steps, "--steps")
    elif args.target_tokens:
        target = parse_count(args.target_tokens, "--target-tokens")
        total = target // tps
    elif cfg and cfg.train.target_tokens:
        # The config's target in this plan's tokens per step (which --tokens-per-step may change), as train counts.
        target = cfg.train.target_tokens
        total = target // tps
    elif cfg:
        total = cfg.total_steps
    else:
        raise BatonError("plan needs --target-tokens or --steps (or --config)")
    if args.rate:
        rate, src["rate"] = parse_rate(args.rate, "--rate"), "given"
    elif args.rate_from:
        from ..bench import rate_from_json
        from ..guard import input_path

        rate, src["rate"] = rate_from_json(input_path(args.rate_from, "--rate-from", "give a bench.json written by "
                                                      "`baton bench`"))
    else:
        measured, src["rate"] = L.measured_rate(records)
        if measured is None:
            raise BatonError("plan needs a rate: --rate TOK/S, --rate-from bench.json, or a config whose ledger "
                             "holds a measured session")
        rate = measured
    hours = parse_hours(args.session_hours, "--session-hours") if args.session_hours else (b.session_hours if b else 0)
    if args.session_hours and not hours:
        raise BatonError(f"--session-hours must be > 0, got {args.session_hours!r}: the platform's session limit")
    if not hours:
        raise BatonError("plan needs --session-hours (or budget.session_hours in the config)")
    margin = parse_margin(args.margin, hours) if args.margin else ((b.margin_minutes / 60) if b else 0.0)
    ckpt = None
    if args.ckpt_seconds is not None:
        ckpt, src["ckpt"] = float(args.ckpt_seconds), "given"
    else:
        ckpt, src["ckpt"] = L.checkpoint_cycle(b.ckpt_seconds if b else 0.0, records)
    quota = None
    qh = parse_hours(args.quota_hours, "--quota-hours") if args.quota_hours else (b.quota_hours if b else 0.0)
    reset = parse_instant(args.quota_reset, "--quota-reset") if args.quota_reset else (
        parse_instant(b.quota_reset) if b and b.quota_reset else None)
    period_days = args.quota_period_days or (b.quota_period_days if b else 7.0)
    if period_days > 36500:
        raise BatonError(f"--quota-period-days {args.quota_period_days} is longer than a century")
    start = parse_instant(args.start, "--start") if args.start else datetime.now(timezone.utc)
    if qh:
        from ..planning.plan import Quota

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
        if store is not None and cfg is not None:
            from ..checkpoint.pull import read_pointer

            try:
                pointer = read_pointer(store, cfg.run.name)
            except BatonError as e:
                raise BatonError(f"{e} (pass --start-step to plan anyway)") from None
            if pointer:
                start_step, src["start_step"] = min(pointer.step, total), "the store's pointer"
    cadence = _cadence(args, b, records, ckpt, src, hours, margin)
    inp = PlanInput(
        total_steps=total, tokens_per_step=tps, rate=rate, session_hours=hours, margin_hours=margin,
        ckpt_every_s=cadence.minutes * 60,
        startup_seconds=_startup(args, b, records, src),
        ckpt_seconds=ckpt or 0.0,
        ckpt_every=args.ckpt_every if args.ckpt_every is not None else (cfg.train.ckpt_every if cfg else 0),
        start_step=start_step, target_tokens=target, quota_hours=qh, quota_period_hours=period_days * 24,
        quota_reset=reset, used_hours=used, cap_left_hours=cap_left,
        # Billed like the ledger: budget.bill_factor, else one per rank (the last session's, or --ranks).
        # --ranks, given, is the run to come: it wins over what the last session was billed at.
        bill_factor=args.bill_factor or (b.bill_factor if b and b.bill_factor else 0.0) or float(args.ranks or 0)
        or (records[-1].bill_factor if records else 0.0) or 1.0,
        gap_hours=parse_hours(args.gap, "--gap"), start=start,
        deadline=parse_instant(args.deadline, "--deadline") if args.deadline else None)
    return inp, src, records


def _cadence(args, b, records: list[L.LedgerRecord], ckpt: float | None, src: dict[str, str], hours: float,
             margin: float):
    """The timed checkpoint cadence: --ckpt-minutes, else budget.ckpt_minutes; "auto" chosen from the ledger."""
    from ..planning.cadence import resolve_cadence

    setting: float | str = b.ckpt_minutes if b else 0.0
    if args.ckpt_minutes is not None:
        text = str(args.ckpt_minutes).strip().lower()
        if text == "auto":
            setting = "auto"
        else:
            try:
                setting = float(text)
            except ValueError:
                setting = -1.0
            if not (math.isfinite(setting) and setting >= 0):
                raise BatonError(f"--ckpt-minutes {args.ckpt_minutes!r} is neither a number of minutes >= 0 nor auto")
    cadence = resolve_cadence(setting, records, ckpt, hours, hours - margin, src.get("ckpt", "given"))
    if setting == "auto" or cadence.minutes:
        src["cadence"] = cadence.reason
    return cadence


def _startup(args, b, records: list[L.LedgerRecord], src: dict[str, str]) -> float:
    """Seconds per session before the first step: given, configured, else measured by earlier sessions."""
    from ..planning import ledger as L

    if args.startup:
        src["startup"] = "given"
        return parse_hours(args.startup, "--startup") * HOUR
    seconds, src["startup"] = L.startup_figure(b.startup_minutes if b else 0.0, records)
    return seconds or 0.0


def _h(hours: float) -> str:
    return f"{hours:.2f}" if hours >= 1 else f"{hours:.4f}"


def _h_short(hours: float) -> str:
    """A headline's hours: tenths, and below an hour the digits that say it (never "0.0 h")."""
    return f"{hours:,.1f}" if hours >= 1 else f"{hours:.3g}"


def format_plan(p, src: dict[str, str]) -> str:
    i = p.input
    target = i.target_tokens or i.total_steps * i.tokens_per_step
    lines = [
        f"horizon: {i.total_steps:,} steps x {i.tokens_per_step:,} tokens = {i.total_steps * i.tokens_per_step:,} "
        f"tokens" + (f" (target {i.target_tokens:,})" if i.target_tokens else "")
        + (f"; planning from step {i.start_step:,} ({src.get('start_step', 'given')})" if i.start_step else ""),
        f"rate: {i.rate:,.0f} tok/s ({src.get('rate', 'given')}) = {i.step_seconds:.2f} s/step",
        f"{target:,} tokens at {i.rate:,.0f} tok/s = {_h_short(p.target_hours)} h; the steps left take "
        f"{_h(p.stepping_hours)} h of stepping",
        f"sessions of {i.session_hours:g} h with {_h(i.margin_hours)} h margin = {_h(i.usable_seconds / HOUR)} h "
        f"usable; checkpoint cycle {i.ckpt_seconds:g} s ({src.get('ckpt', 'given')})"
        + (f" every {i.ckpt_every} steps" if i.ckpt_every else "" if i.ckpt_every_s else " at session ends")
        + (f"{' and' if i.ckpt_every else ''} every {i.ckpt_every_s / 60:.3g} min" if i.ckpt_every_s else "")
        + (f"; startup {i.startup_seconds / 60:.3g} min ({src.get('startup', 'given')})" if i.startup_seconds
           else ""),
    ]
    if src.get("cadence"):
        lines.append(f"checkpoint cadence: {src['cadence']}")
    if i.quota_hours:
        lines.append(f"quota: {i.quota_hours:g} h per {i.quota_period_hours / 24:g} days, resetting at "
                     f"{iso(i.quota_reset or i.start)}; {i.used_hours:.2f} h used this period "
                     f"({src.get('used', 'none recorded')})")
    lines += ["", "| session | steps | stop_after_steps | start | end | hours | billed h | note |",
              "|---|---|---|---|---|---|---|---|"]
    for s in p.sessions:
        # Both ends to the minute, rounded up alike: a session that starts as the last one ends is not printed
        # starting a minute before it.
        lines.append(f"| {s.index} | {s.start_step:,} → {s.stop_after_steps:,} | {s.stop_after_steps} | {iso_by(s.start)} "
                     f"| {iso_by(s.end)} | {_h(s.hours)} | {_h(s.billed_hours)} | {s.note} |")
    lines += ["", f"{len(p.sessions)} sessions, {_h(p.wall_hours)} h wall clock, {_h(p.billed_hours)} GPU-hours "
              f"billed; ETA {iso_by(p.eta)}"]
    lines += [f"warning: {w}" for w in p.warnings]
    lines.append("each session: baton train -c CONFIG --stop-after-steps <stop_after_steps> "
                 f"--session-hours {i.session_hours:.6g}")
    return "\n".join(lines)
