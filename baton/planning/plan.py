"""The session planner: from a horizon, a rate and a quota to sessions, a calendar and a bill.

Pure arithmetic (no torch): every number `baton plan` prints comes from here, so the tests can check
them exactly. Times are seconds internally and hours on output; instants are timezone-aware UTC.

A session's wall clock is ``startup + steps x step_time + checkpoints x cycle_time``: one checkpoint at
every multiple of ``ckpt_every`` inside the session (and, with a timed cadence ``ckpt_every_s``, one whenever
that long passed since the last one began, as the session's clock decides), one at its end, and one more at
the horizon for the exported model. A session must fit ``session_hours - margin``.

``plan`` walks the sessions over the calendar with ``walk``; the simulator (``planning.simulate``) walks the
same calendar with sessions cut short, so the two agree exactly when nothing is cut.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from ..errors import BatonError

HOUR = 3600.0
# More sessions than this is a horizon or a rate off by orders of magnitude (1e12 steps, 5 tok/s), not a plan:
# refused in one line instead of building, calendaring and printing millions of rows.
MAX_SESSIONS = 100_000


# --------------------------------------------------------------------------------------- parsing


def parse_hours(text: str | float, what: str = "duration") -> float:
    """'9h', '90m', '45s', '1h30m', a bare number of hours, or a SLURM time limit ('2-00:00:00', '1:30:00') -> hours,
    at most a century."""
    return _hours_bound(_parse_hours(text, what), text, what)


def _parse_hours(text: str | float, what: str) -> float:
    if isinstance(text, (int, float)):
        return _finite(float(text), text, what)
    s = text.strip().lower()
    try:
        return _finite(float(s), text, what)
    except ValueError:
        pass
    if SLURM_TIME.fullmatch(s):
        return parse_time_limit(s, what)
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)\s*(d|h|m|s)", s)
    if not parts or re.sub(r"(\d+(?:\.\d*)?|\.\d+)\s*(d|h|m|s)", "", s).strip():
        raise BatonError(f"{what} {text!r} is not a duration (examples: 9h, 90m, 1h30m, 45s, 2.5, or a SLURM time limit such as 2-00:00:00)")
    unit = {"d": 24.0, "h": 1.0, "m": 1 / 60, "s": 1 / 3600}
    return _finite(sum(float(n) * unit[u] for n, u in parts), text, what)


# SLURM's time limit forms with a ':' or a '-' (a bare number is hours here, minutes to SLURM, so it is left out):
# minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, days-hours:minutes:seconds.
SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def parse_time_limit(text: str, what: str = "time limit") -> float:
    """A SLURM time limit as sbatch --time and ``scontrol show job``'s TimeLimit write it -> hours.

    '2-00:00:00' is 48 h, '1:30:00' 1.5 h, '45:00' 45 minutes, '1-12' 36 h; UNLIMITED is refused (no budget is
    leaving the option out)."""
    s = text.strip().lower()
    m = SLURM_TIME.fullmatch(s)
    if not m or (m.group(1) is None and m.group(3) is None):
        raise BatonError(f"{what} {text!r} is not a SLURM time limit (examples: 2-00:00:00, 1-12, 12:00:00, 90:00)")
    days, a, b, c = (int(g) if g is not None else None for g in m.groups())
    if days is not None:  # days-hours[:minutes[:seconds]]
        seconds = days * 86400 + (a or 0) * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:  # hours:minutes:seconds
        seconds = (a or 0) * 3600 + (b or 0) * 60 + c
    else:  # minutes:seconds
        seconds = (a or 0) * 60 + (b or 0)
    return _finite(seconds / HOUR, text, what)


def _finite(value: float, text: object, what: str) -> float:
    """A duration or count is a finite number >= 0: NaN and infinity would pass every later comparison."""
    if not math.isfinite(value) or value < 0:
        raise BatonError(f"{what} {text!r} must be a finite number >= 0")
    return value


MAX_HOURS = 100 * 365 * 24  # a century: any longer duration is a typo, and the calendar's dates would overflow


def _hours_bound(value: float, text: object, what: str) -> float:
    if value > MAX_HOURS:
        raise BatonError(f"{what} {text!r} is longer than a century")
    return value


def parse_margin(text: str, session_hours: float) -> float:
    """'30%' of the session, or a duration -> hours."""
    s = text.strip()
    if s.endswith("%"):
        try:
            pct = float(s[:-1])
        except ValueError:
            raise BatonError(f"margin {text!r} is not a percentage (example: 30%)") from None
        if not 0 <= pct < 100:
            raise BatonError(f"margin {text!r} must be between 0% and 100%")
        return session_hours * pct / 100
    return parse_hours(s, "margin")


MAX_COUNT = 1e18  # tokens, steps: far past any run, and still exact in a 64-bit integer


def parse_number(text: str | int | float, what: str) -> float:
    """'1e9', '0.9B', '900M', '262,144', '2.5k' -> a finite number >= 0 (a rate keeps its fraction)."""
    if isinstance(text, (int, float)):
        value = _finite(float(text), text, what)
    else:
        s = text.strip().replace(",", "").replace("_", "")
        mult = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}.get(s[-1:].lower())
        try:
            value = float(s[:-1]) * mult if mult else float(s)
        except ValueError:
            raise BatonError(f"{what} {text!r} is not a number (examples: 1e9, 0.9B, 900M, 262144)") from None
        value = _finite(value, text, what)
    if value > MAX_COUNT:
        raise BatonError(f"{what} {text!r} is beyond any run (at most {MAX_COUNT:.0e})")
    return value


def parse_count(text: str | int | float, what: str) -> int:
    """'1e9', '0.9B', '900M', '262,144' -> a whole number: a count with a fraction is a typo, not rounded."""
    value = parse_number(text, what)
    if abs(value - round(value)) > 1e-9 * max(1.0, value):
        raise BatonError(f"{what} {text!r} is not a whole number")
    return int(round(value))


def parse_rate(text: str | int | float, what: str) -> float:
    """Tokens per second, > 0; a fraction is kept (a slow CPU run measures 0.4 tok/s)."""
    value = parse_number(text, what)
    if value <= 0:
        raise BatonError(f"{what} {text!r} must be > 0 tokens/s")
    return value


def parse_instant(text: str, what: str = "time") -> datetime:
    """An ISO 8601 instant; 'Z' accepted; a naive time is taken as UTC."""
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BatonError(f"{what} {text!r} is not an ISO 8601 time (example: 2026-09-26T00:00Z)") from None
    if not 1970 <= t.year <= 9000:  # a plan's calendar adds sessions, gaps and periods to it: room before 9999
        raise BatonError(f"{what} {text!r} is outside the years 1970 to 9000")
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _hours(h: float) -> str:
    """Tenths of an hour, three digits below one: a warning about minutes does not say "0.0 h"."""
    return f"{h:,.1f}" if abs(h) >= 1 else f"{h:.3g}"


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def iso_by(t: datetime) -> str:
    """When something is done by (an end, an ETA, a finish), to the minute and rounded up: a deadline at the
    printed time is then met, as the planner and the simulation compare it."""
    t = t.astimezone(timezone.utc)
    if t.second or t.microsecond:
        t = t.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return iso(t)


# ------------------------------------------------------------------------------------- the input


@dataclass
class PlanInput:
    total_steps: int
    tokens_per_step: int
    rate: float  # tokens/s over all ranks, while stepping
    session_hours: float  # the platform's session limit
    margin_hours: float = 0.0  # kept free at the end of every session
    startup_seconds: float = 0.0  # per session, before the first step (install, pull, build)
    ckpt_seconds: float = 0.0  # one checkpoint cycle: save, push, verify, pointer, prune
    ckpt_every: int = 0  # step cadence of intermediate checkpoints (0 = only at session ends)
    ckpt_every_s: float = 0.0  # timed cadence (budget.ckpt_minutes): a checkpoint once this long passed since the last
    start_step: int = 0
    target_tokens: int = 0  # the goal the horizon was derived from (0 = the horizon itself)
    quota_hours: float = 0.0  # billed hours per quota period (0 = no quota)
    quota_period_hours: float = 168.0
    quota_reset: datetime | None = None  # any instant at which the quota resets
    used_hours: float = 0.0  # billed in the current period before the plan starts
    cap_left_hours: float | None = None  # what a lifetime cap still allows (None = no cap)
    bill_factor: float = 1.0  # billed hours per wall-clock hour (accelerators billed)
    gap_hours: float = 0.0  # between one session's end and the next one's start
    min_session_hours: float = 0.25  # shorter leftovers of a quota period are not worth a session
    start: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    deadline: datetime | None = None

    @property
    def step_seconds(self) -> float:
        return self.tokens_per_step / self.rate

    @property
    def usable_seconds(self) -> float:
        return (self.session_hours - self.margin_hours) * HOUR

    def check(self) -> None:
        problems = []
        if self.total_steps <= 0:
            problems.append("the horizon must be at least one step")
        if self.tokens_per_step <= 0:
            problems.append("tokens per step must be > 0")
        if not self.rate > 0:
            problems.append("the rate must be > 0 tokens/s (measure it with baton bench, or pass --rate)")
        if not self.session_hours > 0:
            problems.append("the session length must be > 0 (--session-hours)")
        elif self.margin_hours < 0 or self.margin_hours >= self.session_hours:
            problems.append(f"the margin ({self.margin_hours:.2f} h) must be >= 0 and shorter than the session "
                            f"({self.session_hours:.2f} h)")
        if not 0 <= self.start_step <= self.total_steps:
            problems.append(f"the start step {self.start_step} is outside 0..{self.total_steps}")
        if min(self.startup_seconds, self.ckpt_seconds, self.ckpt_every, self.ckpt_every_s, self.gap_hours,
               self.used_hours) < 0:
            problems.append("startup, checkpoint time, cadence, gap and hours used must be >= 0")
        if self.quota_hours < 0 or self.quota_period_hours <= 0 or self.bill_factor <= 0:
            problems.append("quota hours must be >= 0, the quota period and the bill factor > 0")
        if problems:
            raise BatonError("cannot plan: " + "; ".join(problems))


# ------------------------------------------------------------------------------------ the sessions


def checkpoints_in(a: int, b: int, every: int, total: int) -> int:
    """Checkpoint cycles a session over steps [a, b) runs: cadence ones inside, the end, the export."""
    inner = (b - 1) // every - a // every if every > 0 else 0
    return inner + 1 + (1 if b == total else 0)


def cadence_points(inp: PlanInput, a: int, b: int) -> list[int]:
    """The steps inside a session over [a, b) at which a cadence checkpoint runs (the end's is not one).

    Multiples of ``ckpt_every``; with a timed cadence also the first boundary at which ``ckpt_every_s`` has
    passed since the last checkpoint began (the session's clock starts at its first step, and every
    checkpoint, whatever its reason, starts it again: ``session.clock.TimeBudget``).
    """
    every, tau, s, c = inp.ckpt_every, inp.ckpt_every_s, inp.step_seconds, inp.ckpt_seconds
    out: list[int] = []
    if tau <= 0:
        return list(range((a // every + 1) * every, b, every)) if every > 0 else []
    first = max(1, math.ceil(tau / s - 1e-9))  # steps from the session's first step to the first timed one
    after = max(1, math.ceil((tau - c) / s - 1e-9))  # steps from a checkpoint to the next timed one
    if every <= 0:
        return list(range(a + first, b, after))
    m = a + first
    while True:
        nxt = (out[-1] if out else a) // every * every + every if every > 0 else b
        m_step = min(m, nxt)
        if m_step >= b:
            return out
        out.append(m_step)
        m = m_step + after


def cycles(inp: PlanInput, a: int, b: int) -> int:
    """Checkpoint cycles of a session over [a, b): its cadence points, its end, and the export at the horizon."""
    if inp.ckpt_every_s <= 0:
        return checkpoints_in(a, b, inp.ckpt_every, inp.total_steps)
    if inp.ckpt_every > 0:
        inner = len(cadence_points(inp, a, b))
    else:  # the timed points alone, counted without listing them (the planner asks for many ranges)
        first = max(1, math.ceil(inp.ckpt_every_s / inp.step_seconds - 1e-9))
        after = max(1, math.ceil((inp.ckpt_every_s - inp.ckpt_seconds) / inp.step_seconds - 1e-9))
        inner = 0 if a + first >= b else 1 + (b - 1 - a - first) // after
    return inner + 1 + (1 if b == inp.total_steps else 0)


def session_seconds(inp: PlanInput, a: int, b: int) -> float:
    return inp.startup_seconds + (b - a) * inp.step_seconds + cycles(inp, a, b) * inp.ckpt_seconds


def capacity(inp: PlanInput, a: int, limit_seconds: float | None = None) -> int:
    """The most steps a session starting at step ``a`` fits into ``limit_seconds`` (default: usable time)."""
    limit = inp.usable_seconds if limit_seconds is None else limit_seconds
    room = limit - inp.startup_seconds - inp.ckpt_seconds
    if room < inp.step_seconds:
        return 0
    n = min(int(room // inp.step_seconds), inp.total_steps - a)
    # A cadence adds a cycle every few steps (every step, at worst), so the steps that fit may be far fewer than
    # ``n``: bisect (a session's length only grows with its steps).
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if session_seconds(inp, a, a + mid) <= limit else (lo, mid - 1)
    return lo


def split(inp: PlanInput, a: int, b: int) -> list[tuple[int, int]]:
    """Contiguous step ranges covering [a, b), each fitting one session, as few as possible.

    Equal sessions, the last running to ``b`` (it absorbs the division's remainder); when that makes
    the last one too long, the remainder is spread one step each over the final sessions instead.
    """
    remaining = b - a
    if remaining <= 0:
        return []
    cap = capacity(inp, a)
    if cap == 0:
        raise BatonError(
            f"a session of {inp.session_hours:g} h minus {inp.margin_hours:g} h margin cannot fit one step "
            f"({inp.step_seconds:.1f} s) plus {inp.startup_seconds / 60:g} min of startup and a {inp.ckpt_seconds:g} s "
            "checkpoint cycle: lengthen the session, or shrink the margin, the startup or the checkpoint time")
    n = math.ceil(remaining / cap)
    if n > MAX_SESSIONS:
        raise BatonError(
            f"the plan needs {n:,} sessions ({remaining:,} steps at {inp.step_seconds:.3g} s/step, at most {cap:,} "
            f"per session), more than {MAX_SESSIONS:,}: check the horizon (--steps, --target-tokens) and the rate")
    # Steps that fit a session wherever it starts: the cadence's alignment moves a range's checkpoint count by
    # one at most, and the horizon's export adds one more. After a few tries, the split jumps to that length
    # instead of adding one session at a time (each try checks every range: linear tries would be quadratic).
    anywhere = capacity(inp, a, inp.usable_seconds - 2 * inp.ckpt_seconds)
    for tries in itertools.count():
        if tries == 3 and anywhere > 0:
            n = max(n, math.ceil(remaining / anywhere))
        base, rest = divmod(remaining, n)
        tail = [base] * (n - 1) + [base + rest]
        spread = [base] * (n - rest) + [base + 1] * rest
        for lengths in (tail, spread):
            ranges, s = [], a
            for length in lengths:
                ranges.append((s, s + length))
                s += length
            if all(session_seconds(inp, x, y) <= inp.usable_seconds for x, y in ranges):
                return ranges
        if n >= remaining:  # one step a session, and still one does not fit: no split can
            x = next(x for x in range(a, b) if session_seconds(inp, x, x + 1) > inp.usable_seconds)
            raise BatonError(
                f"a session of step {x + 1} alone needs {session_seconds(inp, x, x + 1):.0f} s ({inp.step_seconds:.1f} s "
                f"for the step, {inp.startup_seconds:g} s of startup and {cycles(inp, x, x + 1)} checkpoint cycles of "
                f"{inp.ckpt_seconds:g} s{', the horizon export among them' if x + 1 == inp.total_steps else ''}), more "
                f"than the {inp.usable_seconds:.0f} s a session has: lengthen the session, or shrink the margin, the "
                "startup or the checkpoint time")
        n += 1  # capacities differ a little by checkpoint alignment; one more session always helps
    raise AssertionError("unreachable")  # (itertools.count never ends)


# ------------------------------------------------------------------------------------- the calendar


@dataclass
class Quota:
    """Billed hours per period, resetting at ``reset + k x period``."""

    hours: float
    period: timedelta
    reset: datetime

    def period_start(self, t: datetime) -> datetime:
        k = math.floor((t - self.reset) / self.period)
        return self.reset + k * self.period

    def period_end(self, t: datetime) -> datetime:
        return self.period_start(t) + self.period


@dataclass
class SessionPlan:
    index: int
    start_step: int
    stop_after_steps: int
    hours: float  # wall clock
    billed_hours: float
    start: datetime
    end: datetime
    checkpoints: int
    note: str = ""

    @property
    def steps(self) -> int:
        return self.stop_after_steps - self.start_step

    def to_dict(self) -> dict[str, Any]:
        return {"session": self.index, "start_step": self.start_step, "stop_after_steps": self.stop_after_steps,
                "steps": self.steps, "hours": round(self.hours, 4), "billed_hours": round(self.billed_hours, 4),
                "start": iso(self.start), "end": iso_by(self.end), "checkpoints": self.checkpoints, "note": self.note}


@dataclass
class Plan:
    input: PlanInput
    sessions: list[SessionPlan]
    warnings: list[str]

    @property
    def stepping_hours(self) -> float:
        """The horizon's steps at the rate, no overheads: the headline 'N tokens at R tok/s = H h'."""
        return (self.input.total_steps - self.input.start_step) * self.input.step_seconds / HOUR

    @property
    def target_hours(self) -> float:
        tokens = self.input.target_tokens or self.input.total_steps * self.input.tokens_per_step
        return tokens / self.input.rate / HOUR

    @property
    def wall_hours(self) -> float:
        return sum(s.hours for s in self.sessions)

    @property
    def billed_hours(self) -> float:
        return sum(s.billed_hours for s in self.sessions)

    @property
    def eta(self) -> datetime:
        return self.sessions[-1].end if self.sessions else self.input.start

    def to_dict(self) -> dict[str, Any]:
        i = self.input
        return {
            "total_steps": i.total_steps, "start_step": i.start_step, "tokens_per_step": i.tokens_per_step,
            "horizon_tokens": i.total_steps * i.tokens_per_step, "target_tokens": i.target_tokens or None,
            "rate_tokens_per_s": i.rate, "step_seconds": round(i.step_seconds, 4),
            "session_hours": i.session_hours, "margin_hours": round(i.margin_hours, 4),
            "usable_hours": round(i.usable_seconds / HOUR, 4),
            "target_hours": round(self.target_hours, 4), "stepping_hours": round(self.stepping_hours, 4),
            "wall_hours": round(self.wall_hours, 4), "billed_hours": round(self.billed_hours, 4),
            "eta": iso_by(self.eta), "sessions": [s.to_dict() for s in self.sessions], "warnings": self.warnings,
        }


@dataclass
class Cut:
    """A session that ended before its planned end: after ``seconds`` of wall clock, with the run resuming
    at ``resume_step`` (the last checkpoint it verified) and ``reached_step`` trained when it ended."""

    seconds: float
    resume_step: int
    reached_step: int
    note: str = "interrupted"


# What decides whether a session runs as planned: (session number, start step, planned end step, planned
# seconds) -> None (it runs to its planned end) or the Cut that ended it.
Cutter = Callable[[int, int, int, float], "Cut | None"]


def plan(inp: PlanInput) -> Plan:
    """Sessions with contiguous step ranges from ``start_step`` to the horizon, placed on a calendar.

    Without a quota, sessions follow each other (plus ``gap_hours``). With one, a session that does not
    fit what is left of the current period is shortened to fit (when at least ``min_session_hours`` is
    left) or waits for the next reset; the steps after a shortened session are split again.
    """
    inp.check()
    return walk(inp)


def walk(inp: PlanInput, cut: Cutter | None = None, splitter: Callable[[int], list[tuple[int, int]]] | None = None,
         max_sessions: int = MAX_SESSIONS) -> Plan:
    """The plan's calendar, session by session (``plan``); ``cut`` may end any session early, after which the
    steps from its resume point are split again, as after a session the quota shortened. ``splitter(a)``:
    ``split(inp, a, total)``, given by a caller that caches it."""
    resplit = splitter or (lambda a: split(inp, a, inp.total_steps))
    quota = None
    if inp.quota_hours > 0:
        quota = Quota(inp.quota_hours, timedelta(hours=inp.quota_period_hours), inp.quota_reset or inp.start)
    warnings: list[str] = []
    if quota and inp.used_hours > inp.quota_hours and cut is None:
        # A session that ran on past the quota (platforms let a running one finish) leaves the period
        # overdrawn: nothing more fits before the reset, which is where the plan starts.
        warnings.append(f"{inp.used_hours:.2f} h used is more than the quota of {inp.quota_hours:g} h: the plan "
                        f"starts at the next reset, {iso(quota.period_end(inp.start))}")
    pending = resplit(inp.start_step)
    sessions: list[SessionPlan] = []
    t = inp.start
    used = inp.used_hours
    period_end = quota.period_end(t) if quota else None
    waited = False  # the next session starts at a quota reset, not when the previous one ended
    while pending:
        if len(sessions) >= max_sessions:
            raise BatonError(f"the plan needs more than {max_sessions:,} sessions"
                             + (f" under a quota of {inp.quota_hours:g} h per period" if quota else "")
                             + ": check the horizon, the rate" + (" and the quota" if quota else "")
                             + (" and the interruptions" if cut else ""))
        a, b = pending[0]
        note = "waits for the quota reset" if waited else ""
        if quota:
            assert period_end is not None  # set together with the quota
            if t >= period_end:  # a new period began while waiting or working
                used, period_end = 0.0, quota.period_end(t)
            left_s = (quota.hours - used) / inp.bill_factor * HOUR
            need = session_seconds(inp, a, b)
            if need > left_s:
                fit = capacity(inp, a, min(left_s, inp.usable_seconds))
                if fit > 0 and left_s >= inp.min_session_hours * HOUR:
                    b = a + fit
                    note = "; ".join(filter(None, [note, "shortened to the quota left in this period"]))
                    pending = [(a, b)] + split(inp, b, inp.total_steps)
                elif used == 0:  # a whole period's quota and still nothing fits: waiting cannot help
                    raise BatonError(
                        f"a quota of {quota.hours:g} h per period cannot hold a session of at least "
                        f"{inp.min_session_hours:g} h with one step and a checkpoint cycle")
                else:
                    t, used, period_end = period_end, 0.0, period_end + quota.period
                    waited = True
                    continue  # wait for the reset, then try the same range again
        seconds = session_seconds(inp, a, b)
        ended = cut(len(sessions), a, b, seconds) if cut is not None else None
        if ended is not None:
            seconds = ended.seconds
            note = "; ".join(filter(None, [note, ended.note]))
        billed = seconds / HOUR * inp.bill_factor
        end = t + timedelta(seconds=seconds)
        sessions.append(SessionPlan(len(sessions) + 1, a, ended.reached_step if ended else b, seconds / HOUR, billed,
                                    t, end, cycles(inp, a, b) if ended is None else 0, note))
        if quota and period_end is not None and end > period_end:  # period_end is None only without a quota
            # Platforms meter continuously: the part after the reset counts against the new period.
            new_start = quota.period_start(end)
            used = min(billed, (end - new_start).total_seconds() / HOUR * inp.bill_factor)
            period_end = new_start + quota.period
        else:
            used += billed
        pending.pop(0)
        if ended is not None:
            pending = resplit(ended.resume_step)
        waited = False
        t = end + timedelta(hours=inp.gap_hours)
    if cut is not None:
        return Plan(inp, sessions, warnings)
    total = sum(s.billed_hours for s in sessions)
    if inp.cap_left_hours is not None and total > inp.cap_left_hours:
        left = inp.cap_left_hours
        warnings.append(f"the plan bills {_hours(total)} h but " + (f"the cap leaves {_hours(left)} h" if left > 0
                        else f"the cap is already spent ({_hours(-left)} h over)"))
    if inp.deadline is not None and sessions and sessions[-1].end > inp.deadline:
        warnings.append(f"the plan ends {iso_by(sessions[-1].end)}, after the deadline {iso(inp.deadline)}")
    return Plan(inp, sessions, warnings)
