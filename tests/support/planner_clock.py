"""The planner's clock for anytime mode's tests: the ledger as the forecast's own accounting bills it.

Anytime mode forecasts from the run's ledger and the time now (``baton.session.anytime.books``). A test run on a
tiny model trains a step in milliseconds, so its real ledger would make every quota look endless, and its
verdicts would depend on the machine's speed. ``SimulatedBooks`` stands in for ``books``: it reads the real
ledger (the sessions, their step ranges and outcomes, exactly as the relay wrote them) and bills each session as
the planner accounts a session (``baton.planning.plan``): start-up, then ``step_seconds`` per step and
``ckpt_seconds`` per checkpoint cycle, the sessions one after the other from ``origin``, at ``rate`` tokens/s.
The time now is where the session deciding has got to. Nothing waits; the same relay gives the same books.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

from baton.planning.ledger import OPEN, LedgerRecord
from baton.session import anytime

ORIGIN = datetime(2026, 1, 5, tzinfo=timezone.utc)


@dataclasses.dataclass
class SimulatedBooks:
    step_seconds: float  # the rate, as the planner's seconds per step
    tokens_per_step: int
    startup_seconds: float
    ckpt_seconds: float
    ckpt_every: int  # the config's train.ckpt_every: where the sessions checkpointed
    origin: datetime = ORIGIN
    real = staticmethod(anytime.books)

    def __call__(self, s, step: int) -> anytime.Books:
        real = self.real(s, step)
        live = s.parts.ledger.id if s.parts.ledger is not None else None
        records, t = [], self.origin.timestamp()
        for r in real.records:
            if r.steps_from is None:
                continue
            mine = r.session == live
            end = step if mine else r.steps_to or r.steps_from
            seconds = self.session_seconds(r.steps_from, end, ended=not mine)
            records.append(dataclasses.replace(
                r, started_ts=t, heartbeat_ts=t + seconds, ended_ts=None if mine else t + seconds, bill_factor=1.0,
                outcome=OPEN if mine else r.outcome, startup_seconds=self.startup_seconds,
                tokens_per_s=self.tokens_per_step / self.step_seconds, checkpoints=[]))
            t += seconds
        return anytime.Books(records, datetime.fromtimestamp(t, timezone.utc))

    def session_seconds(self, a: int, b: int, ended: bool, horizon: int | None = None) -> float:
        """A session over steps [a, b): start-up, its steps, a cycle at each ``ckpt_every`` inside and (once it
        ended) one at its end, and one more for the export when it reached ``horizon``; a session still running
        has not saved the checkpoint it is deciding before."""
        inner = len([x for x in range(a + 1, b) if self.ckpt_every and x % self.ckpt_every == 0])
        cycles = inner + (ended and b > a) + (b == horizon)
        return self.startup_seconds + (b - a) * self.step_seconds + cycles * self.ckpt_seconds

    def billed_hours(self, records: list[LedgerRecord], horizon: int) -> float:
        """The whole run's bill by this accounting (its records read after the run), the export at ``horizon``
        included."""
        return sum(self.session_seconds(r.steps_from, r.steps_to or r.steps_from, True, horizon) for r in records
                   if r.steps_from is not None) / 3600

    def at(self, hours: float) -> datetime:
        return self.origin + timedelta(hours=hours)
