"""Anytime mode's forecast: does a horizon still fit the run's end, at a confidence?

The question `session.anytime` asks at every session start and checkpoint, answered by the simulation
``baton simulate`` runs (``simulate.simulate`` on the plan's own calendar, ``plan.walk``), from the relay as the
ledger shows it (``relay.relay_input``: the measured rate, start-up and checkpoint cycle, the interruption
rate, the hours the quota and the cap have left): with ``confidence`` 0.9, the horizon fits when the P90 of the
GPU-hours billed from here is within what ``budget.cap_hours`` leaves and the P90 of the finish is no later
than ``budget.finish_by``. Pure numbers, no torch; a seeded simulation, so the same ledger gives the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import numpy as np

from .ledger import ForecastNote
from .plan import iso, iso_by
from .relay import Relay
from .simulate import Interruptions, SimInput, forecast, simulate

RUNS = 200  # simulated runs per question: a decision asks a handful, at every checkpoint


def label(confidence: float) -> str:
    """0.9 -> 'P90'."""
    return f"P{confidence * 100:g}"


@dataclass(frozen=True)
class Verdict:
    """The forecast for one horizon from the relay's step: billed hours and finish at the confidence, and whether
    they fit what is left."""

    horizon: int
    billed_hours: float  # more GPU-hours billed from here to the horizon, at the confidence
    finish: datetime  # the finish at the confidence
    hours_left: float | None  # what budget.cap_hours still leaves (None: no cap)
    finish_by: datetime | None  # budget.finish_by (None: none)
    confidence: float

    @property
    def fits(self) -> bool:
        return ((self.hours_left is None or self.billed_hours <= self.hours_left + 1e-9)
                and (self.finish_by is None or self.finish <= self.finish_by))

    def numbers(self) -> str:
        """'P90 0.61 h billed of 0.43 h left, P90 finish 2026-10-01T09:12Z by 2026-10-01T08:00Z': what it is judged on."""
        p = label(self.confidence)
        out = []
        if self.hours_left is not None:
            out.append(f"{p} {self.billed_hours:.3g} h billed of {max(self.hours_left, 0.0):.3g} h the cap leaves")
        if self.finish_by is not None:
            out.append(f"{p} finish {iso_by(self.finish)} by {iso(self.finish_by)}")
        return ", ".join(out)


def judge(relay: Relay, horizon: int, confidence: float, finish_by: datetime | None, runs: int = RUNS,
          seed: int = 0) -> Verdict:
    """The forecast for training from the relay's step to ``horizon``: the simulated relay at the ledger's
    interruption rate, its billed hours and finish at ``confidence``."""
    inp = replace(relay.input, total_steps=horizon, deadline=None, cap_left_hours=None)
    r = simulate(SimInput(inp, Interruptions(rate_per_hour=relay.interrupt_rate, source="ledger"), runs=runs,
                          seed=seed))
    q = 100 * confidence
    finish = datetime.fromtimestamp(float(np.percentile(r.finish, q)), timezone.utc)
    return Verdict(horizon, float(np.percentile(r.billed_hours, q)), finish, relay.totals.cap_left, finish_by,
                   confidence)


def forecast_note(relay: Relay, records: list[Any]) -> ForecastNote | None:
    """The forecast a session records when it starts (``LedgerRecord.forecast``): the plan's ETA and the
    simulated finish (P50, P90) and bill, from the relay's step to its horizon; None when it cannot be made."""
    inp = relay.input
    f = forecast(inp, records, now=inp.start.timestamp())
    if f.get("problem"):
        return None
    return ForecastNote(step=inp.start_step, horizon=inp.total_steps, at=iso(inp.start), plan_eta=f["plan_eta"],
                        p50=f["p50"], p90=f["p90"], billed_hours_p50=f["billed_hours_p50"],
                        billed_hours_p90=f["billed_hours_p90"])
