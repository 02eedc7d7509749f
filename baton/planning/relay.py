"""The relay from where it stands: the plan's input fed by the config's ``[budget]`` and the ledger.

``baton status`` (its ETA and simulated finish), the forecast a session records when it starts, and anytime mode
(``session.anytime``) all plan the rest of a run from the same figures: the ledger's measured rate, the
start-up and checkpoint cycle (configured, else measured), the checkpoint cadence (``budget.ckpt_minutes``,
"auto" resolved from the ledger), the hours the current quota period and the cap have left, and the time now.
One builder, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from . import ledger as L
from .cadence import Cadence, observe, resolve_cadence
from .plan import PlanInput


@dataclass
class Relay:
    """The plan's input from step ``input.start_step`` to the horizon, and what each figure came from."""

    input: PlanInput
    sources: dict[str, str]  # rate, ckpt, startup: where each came from, in the words `baton plan` uses
    cadence: Cadence
    totals: L.Totals  # the ledger's totals at ``input.start``
    interrupt_rate: float  # interruptions per session hour, as the ledger shows them (``cadence.observe``)
    interrupt_why: str


def relay_input(budget: Any, total_steps: int, tokens_per_step: int, ckpt_every: int, start_step: int,
                records: list[L.LedgerRecord], rate: float, rate_source: str, now: datetime | None = None,
                billed: list[L.LedgerRecord] | None = None) -> Relay:
    """The relay from ``start_step`` to ``total_steps`` at ``rate`` tokens/s, starting ``now``, under ``budget``
    (the config's ``[budget]``; it needs ``session_hours``). No deadline: whoever has one compares the finish
    with it (a simulation refuses a deadline the plan itself misses). ``records``: this run's sessions, whose
    start-up, checkpoint cycle and cuts are measured; ``billed``: every session the quota and the cap count (the
    main run's and its cooldown branches'), ``records`` when not given."""
    b = budget
    now = now or datetime.now(timezone.utc)
    quota = L.quota_from(b)
    t = L.totals(records if billed is None else billed, quota, b.cap_hours, now)
    ckpt, ckpt_src = L.checkpoint_cycle(b.ckpt_seconds, records)
    startup, startup_src = L.startup_figure(b.startup_minutes, records)
    cadence = resolve_cadence(b.ckpt_minutes, records, ckpt or 0.0, b.session_hours,
                              b.session_hours - b.margin_minutes / 60, ckpt_src, now=now.timestamp())
    irq, why = observe(records, now.timestamp()).rate_per_hour(b.session_hours)
    inp = PlanInput(
        total_steps=total_steps, tokens_per_step=tokens_per_step, rate=rate,
        session_hours=b.session_hours, margin_hours=b.margin_minutes / 60,
        startup_seconds=startup or 0.0,
        ckpt_seconds=ckpt or 0.0, ckpt_every=ckpt_every, ckpt_every_s=cadence.minutes * 60,
        start_step=start_step, quota_hours=b.quota_hours, quota_period_hours=b.quota_period_days * 24,
        quota_reset=quota.reset if quota else None, used_hours=t.period_hours or 0.0,
        cap_left_hours=t.cap_left, bill_factor=b.bill_factor or (records[-1].bill_factor if records else 1.0),
        start=now)
    return Relay(inp, {"rate": rate_source, "ckpt": ckpt_src, "startup": startup_src}, cadence, t, irq, why)
