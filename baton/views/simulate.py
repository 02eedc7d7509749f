"""The simulator's inputs, read like the plan's (``views.plan``) plus the interruption and outage models, and the
summary ``baton simulate`` prints; ``baton.simulate`` returns both."""

from __future__ import annotations

import math
from typing import Any

from ..config import Config
from ..errors import BatonError
from ..guard import count, finite_float
from ..planning.cadence import observe
from ..planning.ledger import LedgerRecord
from ..planning.plan import parse_hours
from ..planning.simulate import MAX_RUNS, Interruptions, Outages, SimInput, SimResult
from .plan import plan_input, plan_options

NEVER = ("never", "inf", "-")


def sim_options(p) -> None:
    """The flags of ``baton simulate``: the plan's, and the models of what cuts sessions short."""
    plan_options(p)
    g = p.add_argument_group("simulation")
    g.add_argument("--runs", type=count(1, MAX_RUNS), default=2000, help="simulated runs of the relay (default 2000)")
    g.add_argument("--seed", type=count(0, 2**63 - 1), default=0, help="the same seed gives the same numbers")
    g.add_argument("--interrupt-rate", type=finite_float(0.0), default=None, metavar="PER_HOUR",
                   help="Poisson interruptions per hour of session (default: the ledger's observed rate)")
    g.add_argument("--trace", default=None, metavar="ledger|FILE",
                   help="session lifetimes drawn at random instead: 'ledger' (its sessions: a cut one lived its "
                        "length, the others were never cut) or a file of one lifetime per line (9h, 5h30m, 2.5, or "
                        "'never')")
    g.add_argument("--outage-rate", type=finite_float(0.0), default=0.0, metavar="PER_HOUR",
                   help="store outages per hour")
    g.add_argument("--outage-minutes", type=finite_float(0.0), default=0.0, metavar="M",
                   help="how long each store outage lasts")
    g.add_argument("--curve", action="store_true", help="also simulate a range of timed cadences: expected lost "
                   "and checkpointing hours against the cadence")


def read_trace(path: str) -> list[float]:
    """Session lifetimes in hours (inf: never cut), one per line; blank lines and # comments skipped."""
    from ..guard import input_path
    from ..reads import reading

    p = input_path(path, "--trace", "give 'ledger' or a text file of session lifetimes, one per line")
    with reading(p, "--trace file", "give a text file of session lifetimes, one per line (9h, 5h30m, 2.5, never)"):
        text = p.read_text(encoding="utf-8")
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        item = line.split("#", 1)[0].strip()
        if not item:
            continue
        if item.lower() in NEVER:
            out.append(math.inf)
            continue
        try:
            hours = parse_hours(item, "lifetime")
        except BatonError:
            hours = -1.0
        if not hours > 0:
            shown = item if len(item) <= 40 else item[:40] + "…"
            raise BatonError(f"--trace {p}: line {n}: {shown!r} is not a session lifetime > 0 (a duration such as 9h, "
                             "5h30m or 2.5, or 'never')")
        out.append(hours)
    if not out:
        raise BatonError(f"--trace {p} holds no session lifetimes (one per line: 9h, 5h30m, 2.5, or 'never')")
    return out


def interruptions(args, records: list[LedgerRecord], session_hours: float, src: dict[str, str]) -> Interruptions:
    if args.trace is not None and args.interrupt_rate is not None:
        raise BatonError("give --interrupt-rate or --trace, not both")
    if args.trace == "ledger" and not args.config:
        raise BatonError("--trace ledger reads the run's ledger in its store: give --config (or --trace FILE, or "
                         "--interrupt-rate)")
    if args.trace == "ledger":
        seen = observe(records)
        if not seen.lifetimes_hours:
            raise BatonError("--trace ledger: the ledger holds no training sessions yet (give --interrupt-rate or a "
                             "--trace file)")
        lives = [h if cut else math.inf for h, cut in seen.lifetimes_hours]
        if any(h <= 0 for h in lives):
            raise BatonError("--trace ledger: a cut session in the ledger lived 0 h; give --interrupt-rate instead")
        src["interruptions"] = (f"the ledger's {len(lives)} sessions replayed ({seen.interruptions} cut)")
        return Interruptions(lifetimes_hours=lives, source="ledger")
    if args.trace is not None:
        lives = read_trace(args.trace)
        src["interruptions"] = f"{len(lives)} session lifetimes from {args.trace}"
        return Interruptions(lifetimes_hours=lives, source=str(args.trace))
    if args.interrupt_rate is not None:
        src["interruptions"] = "given"
        return Interruptions(rate_per_hour=args.interrupt_rate, source="given")
    rate, why = observe(records).rate_per_hour(session_hours)
    src["interruptions"] = why
    return Interruptions(rate_per_hour=rate, source="ledger")


def sim_input(args, cfg: Config | None) -> tuple[SimInput, dict[str, str]]:
    inp, src, records = plan_input(args, cfg)
    irq = interruptions(args, records, inp.session_hours, src)
    auto = args.ckpt_minutes == "auto" if args.ckpt_minutes is not None else bool(cfg and cfg.budget.ckpt_minutes == "auto")
    if auto and irq.lifetimes_hours is None and irq.source == "given":
        # "auto" for the rate being simulated, not the ledger's: the question is what that rate would choose.
        from dataclasses import replace

        from ..planning.cadence import auto_cadence

        cadence = auto_cadence(inp.ckpt_seconds, irq.rate_per_hour, "--interrupt-rate",
                               inp.usable_seconds / 3600, src.get("ckpt", "given"))
        inp, src["cadence"] = replace(inp, ckpt_every_s=cadence.minutes * 60), cadence.reason
    retry = cfg.store.retry_seconds if cfg else 300.0
    outages = Outages(args.outage_rate, args.outage_minutes, retry)
    return SimInput(inp, irq, outages, args.runs, args.seed), src


def _h(x: float) -> str:
    return f"{x:,.1f}" if abs(x) >= 10 else f"{x:.3g}"


def format_sim(r: SimResult, src: dict[str, str], curve: dict[str, Any] | None = None) -> str:
    d = r.to_dict()
    i = r.input
    irq = i.interruptions
    model = (f"{irq.rate_per_hour:.3g} interruptions per session hour" if irq.lifetimes_hours is None
             else f"session lifetimes drawn from {len(irq.lifetimes_hours)} observed")
    cad = (f"every {i.plan.ckpt_every} steps" if i.plan.ckpt_every else "") + (
        f"{' and ' if i.plan.ckpt_every else ''}every {i.plan.ckpt_every_s / 60:.1f} min" if i.plan.ckpt_every_s else "")
    lines = [
        f"{i.runs:,} simulated runs (seed {i.seed}): {model} ({src.get('interruptions', 'given')})"
        + (f"; store outages {i.outages.rate_per_hour:g}/h of {i.outages.minutes:g} min, retried for "
           f"{i.outages.retry_seconds:g} s" if i.outages.rate_per_hour else ""),
        f"checkpoints {cad or 'at session ends only'}, {i.plan.ckpt_seconds:g} s per cycle ({src.get('ckpt', 'given')})"
        + (f"; {src['cadence']}" if src.get("cadence") else ""),
        f"without interruptions (baton plan): {d['plan']['sessions']} sessions, {d['plan']['billed_hours']:,.2f} "
        f"GPU-hours, ETA {d['plan']['eta']}",
        "",
        "| | P10 | P50 | P90 | mean |",
        "|---|---|---|---|---|",
        f"| finish | {d['finish']['p10']} | {d['finish']['p50']} | {d['finish']['p90']} | |",
    ]
    for key, name in (("billed_hours", "GPU-hours billed"), ("sessions", "sessions"), ("steps_lost", "steps lost"),
                      ("lost_hours", "hours of steps lost"), ("checkpoint_hours", "hours checkpointing"),
                      ("interruptions_per_run", "interruptions")):
        q = d[key]
        lines.append(f"| {name} | {_h(q['p10'])} | {_h(q['p50'])} | {_h(q['p90'])} | {_h(q['mean'])} |")
    lines.append("")
    if d["p_deadline"] is not None:
        lines.append(f"P(finish by the deadline {d['deadline']}) = {d['p_deadline']:.1%}")
    if d["p_within_cap"] is not None:
        lines.append(f"P(billed within the cap's {i.plan.cap_left_hours:,.2f} h left) = {d['p_within_cap']:.1%}")
    if d["outage_failures_per_run"]:
        lines.append(f"pushes failed by store outages: {d['outage_failures_per_run']:.2f} per run")
    if curve:
        lines += ["", "| cadence (min) | lost h | checkpointing h | overhead h (all but stepping) |", "|---|---|---|---|"]
        lines += [f"| {pt['minutes']:.1f} | {pt['lost_hours']:.3f} | {pt['checkpoint_hours']:.3f} | "
                  f"{pt['overhead_hours']:.3f} |" for pt in curve["points"]]
        if curve.get("fitted_optimum_minutes"):
            lines.append(f"least overhead on the simulated curve: {curve['fitted_optimum_minutes']:.1f} min")
    return "\n".join(lines)


def summary_line(r: SimResult) -> str:
    d = r.to_dict()
    return (f"simulated finish P50 {d['finish']['p50']}, P90 {d['finish']['p90']}; {d['billed_hours']['p50']:,.2f} "
            f"GPU-hours P50 ({d['runs']:,} runs)")
