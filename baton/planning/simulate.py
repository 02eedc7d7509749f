"""The relay on a simulated clock: many runs of the whole campaign, with sessions cut short at random.

Each run walks the plan's own calendar (``plan.walk``: the same sessions, stop rule, quota periods and
billing as ``baton plan``); a session that an interruption ends before its planned end bills its wall
clock up to the cut, and the run resumes from the last checkpoint the session verified, the steps after it
split again into sessions. A session's timeline is the plan's: start-up, then steps, with a checkpoint
cycle at each cadence point (``plan.cadence_points``), at its end, and the export at the horizon; a
checkpoint counts once its cycle has finished. With nothing cut, a run is the plan exactly.

Interruptions: a Poisson process (``rate_per_hour`` of wall clock, counted from each session's start), or
a trace of session lifetimes drawn at random (the ledger's sessions, or a file). Store outages: a Poisson
process of outages of fixed length; a checkpoint that meets one waits for it while the store's retries
last (``retry_seconds``), else the push fails and the session ends with its error. A session slowed past
the platform's limit (``session_hours``) is cut there.

Pure numbers (no torch): thousands of runs take seconds.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import numpy as np

from ..errors import BatonError
from .cadence import observe, optimal_work_seconds
from .ledger import LedgerRecord
from .plan import HOUR, Cut, PlanInput, cadence_points, iso, iso_by, plan, split, walk

MAX_RUNS = 1_000_000
PERCENTILES = (10, 50, 90)


@dataclass
class Interruptions:
    """When sessions are cut: at ``rate_per_hour`` (Poisson), or after lifetimes drawn from ``lifetimes_hours``
    (``math.inf``: a session that was never cut); neither: never."""

    rate_per_hour: float = 0.0
    lifetimes_hours: list[float] | None = None
    source: str = "none"

    def check(self) -> None:
        if not (math.isfinite(self.rate_per_hour) and self.rate_per_hour >= 0):
            raise BatonError(f"the interruption rate must be a finite number >= 0 per hour, got {self.rate_per_hour!r}")
        if self.lifetimes_hours is not None:
            if not self.lifetimes_hours:
                raise BatonError(f"the interruption trace ({self.source}) holds no session lifetimes")
            bad = [x for x in self.lifetimes_hours if not x > 0]  # NaN too
            if bad:
                raise BatonError(f"the interruption trace ({self.source}) holds a lifetime of {bad[0]!r} h: each must "
                                 "be > 0 (inf for a session that was never cut)")


@dataclass
class Outages:
    """Store outages: ``rate_per_hour`` of them, each ``minutes`` long, waited out for ``retry_seconds``."""

    rate_per_hour: float = 0.0
    minutes: float = 0.0
    retry_seconds: float = 300.0

    def check(self) -> None:
        for name, v in (("outage rate", self.rate_per_hour), ("outage length", self.minutes),
                        ("store retry time", self.retry_seconds)):
            if not (math.isfinite(v) and v >= 0):
                raise BatonError(f"the {name} must be a finite number >= 0, got {v!r}")
        if self.rate_per_hour > 0 and self.minutes <= 0:
            raise BatonError("store outages need a length: --outage-minutes M (> 0)")
        # Beyond these an outage is no longer a store's hiccup but the run stopping; the draws grow with both.
        if self.minutes > 7 * 24 * 60:
            raise BatonError(f"an outage of {self.minutes:g} minutes is longer than a week: simulate that as the run "
                             "stopping (a later --start), not as an outage")
        if self.rate_per_hour > 60:
            raise BatonError(f"{self.rate_per_hour:g} outages an hour is more than one a minute: give the rate per "
                             "hour (e.g. 0.05 for one in 20 hours)")


@dataclass
class SimInput:
    plan: PlanInput
    interruptions: Interruptions = field(default_factory=Interruptions)
    outages: Outages = field(default_factory=Outages)
    runs: int = 1000
    seed: int = 0

    def check(self) -> None:
        self.plan.check()
        self.interruptions.check()
        self.outages.check()
        if not 1 <= self.runs <= MAX_RUNS:
            raise BatonError(f"--runs must be in 1..{MAX_RUNS:,}, got {self.runs}")
        if self.seed < 0:
            raise BatonError(f"--seed must be >= 0, got {self.seed}")


class _Draws:
    """The random numbers of a simulation, drawn in blocks from one seeded generator and used in order."""

    BLOCK = 8192

    def __init__(self, seed: int, interruptions: Interruptions):
        self.rng = np.random.default_rng(seed)
        self.irq = interruptions
        self.lives = np.asarray(interruptions.lifetimes_hours or [], dtype=float) * HOUR
        self.buf: list[float] = []

    def kill_after(self) -> float:
        """Seconds from a session's start to its cut (inf: not cut)."""
        if not self.buf:
            if self.irq.lifetimes_hours is not None:
                self.buf = self.lives[self.rng.integers(0, len(self.lives), self.BLOCK)].tolist()
            elif self.irq.rate_per_hour > 0:
                self.buf = self.rng.exponential(HOUR / self.irq.rate_per_hour, self.BLOCK).tolist()
            else:
                return math.inf
            self.buf.reverse()
        return self.buf.pop()

    def outages(self, o: Outages, span: float) -> list[float]:
        """Start times (seconds from a session's start) of the outages that touch [0, span]."""
        length = o.minutes * 60
        n = self.rng.poisson(o.rate_per_hour / HOUR * (span + length))
        return sorted((self.rng.random(n) * (span + length) - length).tolist())


@dataclass
class _Run:
    interruptions: int = 0
    outage_failures: int = 0
    steps_lost: int = 0
    ckpt_seconds: float = 0.0


class _Relay:
    """One simulation's sessions: timelines cached by step range, cuts drawn in order."""

    def __init__(self, si: SimInput):
        self.si, self.inp = si, si.plan
        self.draws = _Draws(si.seed, si.interruptions)
        self.timelines: dict[tuple[int, int], tuple[list[int], list[float]]] = {}
        self.splits: dict[int, list[tuple[int, int]]] = {}
        self.run = _Run()

    def split_from(self, a: int) -> list[tuple[int, int]]:
        if a not in self.splits:
            self.splits[a] = split(self.inp, a, self.inp.total_steps)
        return list(self.splits[a])

    def timeline(self, a: int, b: int) -> tuple[list[int], list[float]]:
        """The steps each checkpoint cycle of a session over [a, b) saves, and when (seconds) each cycle starts."""
        key = (a, b)
        if key not in self.timelines:
            inp = self.inp
            s, c = inp.step_seconds, inp.ckpt_seconds
            steps = cadence_points(inp, a, b) + [b] + ([b] if b == inp.total_steps else [])
            starts = [inp.startup_seconds + (min(p, b) - a) * s + i * c for i, p in enumerate(steps)]
            self.timelines[key] = (steps, starts)
        return self.timelines[key]

    def cut(self, index: int, a: int, b: int, seconds: float) -> Cut | None:
        inp, o, run = self.inp, self.si.outages, self.run
        kill = self.draws.kill_after()
        steps, starts = self.timeline(a, b)
        c = inp.ckpt_seconds
        if kill >= seconds and o.rate_per_hour <= 0:
            run.ckpt_seconds += len(steps) * c
            return None
        if o.rate_per_hour <= 0:  # no outages: the planned timeline, searched
            j = bisect_right(starts, kill)  # the cycles begun before the cut
            if j and kill < starts[j - 1] + c:  # inside cycle j - 1: it never counted
                run.ckpt_seconds += (j - 1) * c
                return self._cut(kill, steps[j - 2] if j >= 2 else a, steps[j - 1], spent=kill - starts[j - 1])
            saved = steps[j - 1] if j else a
            run.ckpt_seconds += j * c
            prev_end = starts[j - 1] + c if j else inp.startup_seconds
            return self._cut(kill, saved, saved + _steps_in(kill - prev_end, inp.step_seconds, steps[j] - saved))
        limit = inp.session_hours * HOUR
        outages = self.draws.outages(o, limit) if o.rate_per_hour > 0 else []
        length, retry = o.minutes * 60, o.retry_seconds
        kill = min(kill, limit)  # the platform ends a session at its limit, however slow its checkpoints were
        delay, saved, prev_end, base = 0.0, a, inp.startup_seconds, a
        for j, t0 in enumerate(starts):
            t = t0 + delay
            if kill < t:  # cut while stepping towards this checkpoint
                return self._cut(kill, saved, base + _steps_in(kill - prev_end, inp.step_seconds, steps[j] - base))
            wait = 0.0
            if outages:
                k = bisect_right(outages, t) - 1
                if k >= 0 and outages[k] + length > t:
                    wait = outages[k] + length - t
            if wait > retry:  # the push gives up: the session ends with the store's error
                if kill < t + retry:
                    return self._cut(kill, saved, steps[j], spent=kill - t)
                run.outage_failures += 1
                run.ckpt_seconds += retry
                run.steps_lost += steps[j] - saved
                return Cut(t + retry, saved, steps[j], "the store was down past its retries")
            delay += wait
            if kill < t + wait + c:  # cut inside the cycle: this checkpoint never counted
                return self._cut(kill, saved, steps[j], spent=max(0.0, kill - t - wait))
            run.ckpt_seconds += c + wait
            saved = base = steps[j]
            prev_end = t + wait + c
        if delay:  # ran to its end, later than planned
            return Cut(seconds + delay, b, b, "slowed by a store outage")
        return None

    def _cut(self, at: float, saved: int, reached: int, spent: float = 0.0) -> Cut:
        run = self.run
        run.interruptions += 1
        run.steps_lost += reached - saved
        run.ckpt_seconds += spent
        return Cut(at, saved, reached)


def _steps_in(seconds: float, step_seconds: float, most: int) -> int:
    return max(0, min(most, int(seconds // step_seconds))) if seconds > 0 else 0


@dataclass
class SimResult:
    input: SimInput
    baseline: Any  # the uninterrupted plan (plan.Plan)
    finish: np.ndarray  # epoch seconds, per run
    billed_hours: np.ndarray
    wall_hours: np.ndarray
    sessions: np.ndarray
    steps_lost: np.ndarray
    interruptions: np.ndarray
    outage_failures: np.ndarray
    ckpt_hours: np.ndarray

    @property
    def stepping_hours(self) -> float:
        i = self.input.plan
        return (i.total_steps - i.start_step) * i.step_seconds / HOUR

    @property
    def lost_hours(self) -> np.ndarray:
        return self.steps_lost * self.input.plan.step_seconds / HOUR

    def p_deadline(self) -> float | None:
        d = self.input.plan.deadline
        return None if d is None else float(np.mean(self.finish <= d.timestamp()))

    def p_cap(self) -> float | None:
        cap = self.input.plan.cap_left_hours
        return None if cap is None else float(np.mean(self.billed_hours <= cap + 1e-9))

    def to_dict(self) -> dict[str, Any]:
        def pct(x: np.ndarray, digits: int = 4) -> dict[str, float]:
            return {f"p{q}": round(float(np.percentile(x, q)), digits) for q in PERCENTILES} | {
                "mean": round(float(np.mean(x)), digits)}

        i, b = self.input, self.baseline
        return {
            "runs": i.runs, "seed": i.seed,
            "interruptions": {"rate_per_hour": i.interruptions.rate_per_hour, "source": i.interruptions.source,
                              "trace_sessions": len(i.interruptions.lifetimes_hours or []) or None},
            "outages": {"rate_per_hour": i.outages.rate_per_hour, "minutes": i.outages.minutes,
                        "retry_seconds": i.outages.retry_seconds},
            "ckpt_every": i.plan.ckpt_every, "ckpt_minutes": round(i.plan.ckpt_every_s / 60, 4),
            "ckpt_seconds": i.plan.ckpt_seconds, "step_seconds": round(i.plan.step_seconds, 4),
            "plan": {"sessions": len(b.sessions), "eta": iso_by(b.eta), "billed_hours": round(b.billed_hours, 4)},
            "finish": {f"p{q}": iso_by(datetime.fromtimestamp(float(np.percentile(self.finish, q)), timezone.utc))
                       for q in PERCENTILES},
            "billed_hours": pct(self.billed_hours), "wall_hours": pct(self.wall_hours),
            "sessions": pct(self.sessions, 2), "steps_lost": pct(self.steps_lost, 2),
            "lost_hours": pct(self.lost_hours), "checkpoint_hours": pct(self.ckpt_hours),
            "interruptions_per_run": pct(self.interruptions, 2),
            "outage_failures_per_run": round(float(np.mean(self.outage_failures)), 4),
            "deadline": iso(i.plan.deadline) if i.plan.deadline else None, "p_deadline": self.p_deadline(),
            "cap_left_hours": i.plan.cap_left_hours, "p_within_cap": self.p_cap(),
        }


def simulate(si: SimInput) -> SimResult:
    """``si.runs`` runs of the relay; the same seed gives the same numbers."""
    si.check()
    inp = si.plan
    baseline = plan(inp)
    if inp.deadline is not None:
        if inp.deadline <= inp.start:
            raise BatonError(f"the deadline {iso(inp.deadline)} is not after the start {iso(inp.start)}: give a later "
                             "--deadline (ISO 8601, e.g. 2026-10-01T00:00Z)")
        if baseline.sessions and inp.deadline < baseline.eta:
            raise BatonError(f"the deadline {iso(inp.deadline)} is before the relay could finish even without "
                             f"interruptions ({iso_by(baseline.eta)}, {len(baseline.sessions)} sessions): give a later "
                             "--deadline, or more hours per session or per quota period")
    relay = _Relay(si)
    n = si.runs
    cols = {k: np.zeros(n) for k in ("finish", "billed", "wall", "sessions", "lost", "irq", "fail", "ckpt")}
    # A relay that needs this many times the planned sessions is not converging: its sessions rarely live
    # to a checkpoint. Said once, not simulated for minutes.
    most = max(2_000, 50 * len(baseline.sessions))
    for r in range(n):
        relay.run = _Run()
        try:
            p = walk(inp, relay.cut, relay.split_from, max_sessions=most)
        except BatonError as e:
            if "more than" not in str(e):
                raise
            raise BatonError(
                f"the relay does not finish within {most:,} sessions (simulated run {r + 1}): sessions are cut before "
                "they verify a checkpoint; checkpoint more often (budget.ckpt_minutes, train.ckpt_every), or check "
                "the interruption rate or trace") from None
        run = relay.run
        cols["finish"][r] = p.eta.timestamp()
        cols["billed"][r] = p.billed_hours
        cols["wall"][r] = p.wall_hours
        cols["sessions"][r] = len(p.sessions)
        cols["lost"][r] = run.steps_lost
        cols["irq"][r] = run.interruptions
        cols["fail"][r] = run.outage_failures
        cols["ckpt"][r] = run.ckpt_seconds / HOUR
    return SimResult(si, baseline, cols["finish"], cols["billed"], cols["wall"], cols["sessions"], cols["lost"],
                     cols["irq"], cols["fail"], cols["ckpt"])


# ------------------------------------------------------------------------------------ the cadence


def cadence_curve(si: SimInput, minutes: list[float]) -> dict[str, Any]:
    """Simulated cost of each timed cadence (the same seed for all: common random numbers), and the optimum
    of the curve ``overhead = A / w + B w + D`` fitted to it (``w``: minutes of work between checkpoints)."""
    c_min = si.plan.ckpt_seconds / 60
    points = []
    for m in minutes:
        r = simulate(replace(si, plan=replace(si.plan, ckpt_every=0, ckpt_every_s=m * 60, deadline=None)))
        points.append({"minutes": m, "wall_hours": float(np.mean(r.wall_hours)),
                       "lost_hours": float(np.mean(r.lost_hours)), "checkpoint_hours": float(np.mean(r.ckpt_hours)),
                       "overhead_hours": float(np.mean(r.wall_hours)) - r.stepping_hours})
    best = None
    w = np.array([p["minutes"] - c_min for p in points])
    if len(points) >= 3 and (w > 0).all():
        y = np.array([p["overhead_hours"] for p in points])
        (a, b, _), *_ = np.linalg.lstsq(np.stack([1 / w, w, np.ones_like(w)], 1), y, rcond=None)
        if a > 0 and b > 0:
            best = float(math.sqrt(a / b) + c_min)
    return {"points": points, "fitted_optimum_minutes": best}


def curve_minutes(si: SimInput) -> list[float]:
    """Cadences around the auto choice for this input (or a spread of them): the simulated curve's grid."""
    c = si.plan.ckpt_seconds
    rate = si.interruptions.rate_per_hour
    if si.interruptions.lifetimes_hours is not None or not rate or not c:
        return [5.0, 10.0, 20.0, 40.0, 80.0, 160.0]
    w = optimal_work_seconds(c, rate / 3600)
    # Half to twice the optimum: wide enough to show the trade, narrow enough that the fitted form's minimum
    # (first order in both terms) lands within a few per cent of the true one.
    return [round((w * f + c) / 60, 3) for f in (0.5, 0.63, 0.8, 1.0, 1.25, 1.6, 2.0)]


def forecast(inp: Any, records: list[LedgerRecord], runs: int = 500, curve: bool = False,
             now: float | None = None) -> dict[str, Any]:
    """The simulated finish of a run in progress: from where the store is, at the ledger's interruption rate as
    of ``now`` (``baton status``; with ``curve``, also the cost of each cadence, for ``baton report``; the
    forecast a session records when it starts). A problem is reported, never raised: the status still shows
    everything else."""
    rate, why = observe(records, now).rate_per_hour(inp.session_hours)
    try:
        # A plan of many sessions costs as many walks per run: fewer runs then, so a status stays quick.
        runs = max(50, min(runs, 100_000 // max(1, len(plan(inp).sessions))))
        si = SimInput(inp, Interruptions(rate_per_hour=rate, source="ledger"), runs=runs)
        r = simulate(si)
        points = cadence_curve(SimInput(inp, si.interruptions, runs=min(runs, 300)), curve_minutes(si)) \
            if curve else None
    except BatonError as e:
        return {"problem": str(e)}
    d = r.to_dict()
    return {"p50": d["finish"]["p50"], "p90": d["finish"]["p90"], "billed_hours_p50": d["billed_hours"]["p50"],
            "billed_hours_p90": d["billed_hours"]["p90"], "interrupt_rate_per_hour": round(rate, 6), "why": why,
            "runs": runs, "plan_eta": d["plan"]["eta"], "ckpt_minutes": d["ckpt_minutes"],
            # 21 quantiles (0 %, 5 %, ..., 100 %) of the finish, epoch seconds: enough to draw its CDF
            "finish_quantiles": [round(float(x), 1) for x in np.percentile(r.finish, np.arange(0, 101, 5))],
            "curve": points}
