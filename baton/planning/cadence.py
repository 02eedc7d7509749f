"""How often to checkpoint, chosen from what checkpoints cost and how often sessions are cut.

With interruptions arriving at random at rate ``lam`` (per second of wall clock) and a checkpoint cycle of
``c`` seconds, a session that checkpoints after every ``w`` seconds of work spends ``c / w`` of its time
checkpointing and loses, per interruption, the work since the last checkpoint. Young's first-order answer
is ``w = sqrt(2 c / lam)`` (Daly's MTBF form: ``sqrt(2 c MTBF)``). For Poisson interruptions the expected
wall clock per unit of work is exactly ``exp(lam s) (exp(lam (w + c)) - 1) / (lam w)`` (``s``, the start-up
a restart costs, scales it but does not move the optimum), minimised at ``lam w = 1 + W0(-exp(-lam c - 1))``;
``optimal_work_seconds`` solves that equation, and the simulator's curve (``simulate.cadence_curve``) checks it.

``budget.ckpt_minutes`` is measured between checkpoint starts (``session.clock.TimeBudget``), so the
cadence it is set to is the work interval plus one cycle.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from .ledger import OPEN, LedgerRecord
from .plan import HOUR


def young_work_seconds(ckpt_seconds: float, rate_per_s: float) -> float:
    """Young/Daly, first order: sqrt(2 C / lambda) = sqrt(2 C MTBF)."""
    return math.sqrt(2 * ckpt_seconds / rate_per_s)


def optimal_work_seconds(ckpt_seconds: float, rate_per_s: float) -> float:
    """The work interval that minimises the expected wall clock under Poisson interruptions (exact).

    Solves (1 - x) e^x = e^(-lam C) for x = lam w in (0, 1) by bisection: the left side falls from 1 to 0.
    """
    target = math.exp(-rate_per_s * ckpt_seconds)
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (1 - mid) * math.exp(mid) > target else (lo, mid)
    return (lo + hi) / 2 / rate_per_s


def expected_wall_per_work(work_seconds: float, ckpt_seconds: float, rate_per_s: float) -> float:
    """Expected wall-clock seconds per second of work at this interval (start-up cost left out: a constant factor)."""
    if rate_per_s <= 0:
        return (work_seconds + ckpt_seconds) / work_seconds
    return math.expm1(rate_per_s * (work_seconds + ckpt_seconds)) / (rate_per_s * work_seconds)


@dataclass
class Observed:
    """Interruptions seen in the ledger: sessions that died without recording an end, over the hours watched."""

    interruptions: int
    hours: float
    sessions: int
    lifetimes_hours: list[tuple[float, bool]]  # (hours the session lived, whether it was cut) per session

    def rate_per_hour(self, session_hours: float) -> tuple[float, str]:
        """The rate to plan with, and why: n / H once interruptions were seen; before that, as if the next
        session were cut (1 / (H + one session)): cautious, and falling as clean hours accumulate."""
        if self.interruptions:
            return self.interruptions / self.hours, (f"{self.interruptions} interruption(s) in {self.hours:.2f} h of "
                                                     f"{self.sessions} session(s) (ledger)")
        span = self.hours + (session_hours or 1.0)
        return 1 / span, (f"no interruption in {self.hours:.2f} h of {self.sessions} session(s) (ledger): planned as "
                          f"one in {span:.2f} h, as if the next session were cut")


def training_records(records: list[LedgerRecord]) -> list[LedgerRecord]:
    """The ledger records of training sessions (not preflight stages, not sessions that never stepped)."""
    return [r for r in records if not (r.kind or "").startswith("preflight") and r.steps_from is not None]


def observe(records: list[LedgerRecord], now: float | None = None) -> Observed:
    """Count the interrupted sessions of a ledger. A record without an end whose heartbeat is recent may still be
    running: it counts as hours watched, not as an interruption."""
    now = time.time() if now is None else now
    n, hours, lives = 0, 0.0, []
    recs = training_records(records)
    for r in recs:
        last = r.last_ts
        lived = max(0.0, last - r.started_ts) / HOUR
        alive = now - last < max(2 * (r.heartbeat_every_s or 0.0), 900.0)
        cut = r.outcome == OPEN and not alive
        n += cut
        hours += lived
        lives.append((lived, cut))
    return Observed(n, hours, len(recs), lives)


@dataclass
class Cadence:
    """A resolved ``budget.ckpt_minutes``: the minutes the session's clock uses, and the reason."""

    minutes: float
    reason: str
    auto: bool = False
    rate_per_hour: float | None = None
    ckpt_seconds: float | None = None
    young_minutes: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ckpt_minutes": round(self.minutes, 4), "auto": self.auto, "reason": self.reason,
                "interrupt_rate_per_hour": self.rate_per_hour, "ckpt_seconds": self.ckpt_seconds,
                "young_minutes": None if self.young_minutes is None else round(self.young_minutes, 4)}


def auto_cadence(ckpt_seconds: float | None, rate_per_hour: float, why_rate: str, usable_hours: float = 0.0,
                 ckpt_source: str = "measured") -> Cadence:
    """The timed cadence for a cycle of ``ckpt_seconds`` and interruptions at ``rate_per_hour``."""
    if not ckpt_seconds:
        return Cadence(0.0, "auto: no checkpoint cycle measured yet (set budget.ckpt_seconds, or train a session): "
                       "checkpoints at session ends until one is", auto=True, rate_per_hour=rate_per_hour)
    if not rate_per_hour > 0:
        return Cadence(0.0, "auto: no interruptions expected: checkpoints at session ends only", auto=True,
                       rate_per_hour=rate_per_hour, ckpt_seconds=ckpt_seconds)
    lam = rate_per_hour / HOUR
    work = optimal_work_seconds(ckpt_seconds, lam)
    young = young_work_seconds(ckpt_seconds, lam)
    minutes = (work + ckpt_seconds) / 60
    why = (f"auto: {minutes:.1f} min between checkpoint starts = {work / 60:.1f} min of work + the {ckpt_seconds:.3g} s "
           f"cycle ({ckpt_source}), the least expected lost plus checkpointing time at {rate_per_hour:.3g} "
           f"interruptions/h ({why_rate}); Young/Daly sqrt(2 C MTBF) = {young / 60:.1f} min")
    if usable_hours and work >= usable_hours * HOUR:
        return Cadence(0.0, why + f"; longer than a session's {usable_hours:.2f} usable hours: checkpoints at session "
                       "ends only", auto=True, rate_per_hour=rate_per_hour, ckpt_seconds=ckpt_seconds,
                       young_minutes=young / 60)
    return Cadence(minutes, why, auto=True, rate_per_hour=rate_per_hour, ckpt_seconds=ckpt_seconds,
                   young_minutes=young / 60)


def resolve_cadence(setting: float | str, records: list[LedgerRecord], ckpt_seconds: float | None,
                    session_hours: float, usable_hours: float = 0.0, ckpt_source: str = "measured",
                    now: float | None = None) -> Cadence:
    """``budget.ckpt_minutes`` as the session's clock uses it: a number as given, "auto" chosen from the ledger."""
    if setting != "auto":
        minutes = float(setting)
        return Cadence(minutes, f"budget.ckpt_minutes = {minutes:g}" if minutes else "no timed cadence "
                       "(budget.ckpt_minutes = 0)")
    rate, why = observe(records, now).rate_per_hour(session_hours)
    return auto_cadence(ckpt_seconds, rate, why, usable_hours, ckpt_source)
