"""Anytime mode (``budget.anytime``): the horizon follows the forecast, so a run whose quota ends early ends
annealed, exported and published instead of stranded on its plateau.

At the start of every session and before every checkpoint, rank 0 asks the forecast (``planning.anytime``: the
plan and the simulation of `baton plan` and `baton simulate`, fed by the ledger) whether the run can still reach
its horizon, wsd cooldown included, within what ``budget.cap_hours`` leaves and by ``budget.finish_by``, at
``budget.anytime_confidence``. The answer, and what follows from it, reaches every rank from rank 0
(``dist.on_main``), so all ranks train to the same horizon.

- It fits: the horizon stays.
- It does not, but a cooldown begun at the next decision (the next checkpoint as the plan places it, or this
  session's stop) still would: the plateau goes on, and the next decision asks again.
- Neither: the horizon is shortened to the longest that fits whose cooldown begins no earlier than now and
  before that next decision: the config's own cooldown (the last ``1 - optim.decay_start`` of the horizon), so
  the schedule stays a pure function of (step, horizon) and the shorter run is, step for step, the run that had
  that horizon from the start (``session.drift.horizon_problem``, the rule a resume that moves the horizon
  obeys, says so). One line logs it with the numbers; the ledger books it (``AnytimeEvent``); the checkpoint
  keeps it (``CheckpointState.shortened``), so every later session trains to it.
- A shortened run never lengthens: once the planned horizon fits again (a quota reset, an added session), one
  line says what it would have done.

Every session start also books the forecast from where it started (``LedgerRecord.forecast``), anytime or not,
for `baton report` to set the predicted finish beside the actual one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fractions import Fraction
from typing import TYPE_CHECKING

from ..checkpoint.record import Shortened
from ..errors import BatonError
from ..model.schedule import decay_begin
from ..planning.anytime import RUNS, Verdict, forecast_note, judge, label
from ..planning.ledger import AnytimeEvent, LedgerRecord, measured_rate, read_run_ledgers
from ..planning.plan import Plan, PlanInput, cadence_points, iso, parse_instant, plan
from ..planning.relay import Relay, relay_input
from ..runs import split_run
from ..runtime import dist

if TYPE_CHECKING:
    from .core import Session

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Books:
    """What the forecast is fed: the run's ledger records (this session's brought up to the decision) and the
    time now."""

    records: list[LedgerRecord]
    now: datetime
    # Every session the quota and the cap count: ``records`` and the sessions of the run's other lines (its main
    # run's, its cooldown branches'), which bill the same quota.
    billed: list[LedgerRecord] | None = None


def books(s: Session, step: int) -> Books:
    """Rank 0: the run's ledger, with this session's own record as it stands at ``step`` (billed to now, its
    measured rate), and the wall clock. The other sessions' records are read from the store once per session:
    the run's lease lets no other session write them meanwhile."""
    p, watch = s.parts, s.anytime
    own = p.ledger.id if p.ledger is not None else None
    if watch.earlier is None:
        line = split_run(p.run)[1]
        everyone = [r for r in read_run_ledgers(p.store, p.run)[0] if r.session != own]
        watch.earlier = [r for r in everyone if r.branch == line]
        watch.others = [r for r in everyone if r.branch != line]
    records = list(watch.earlier)
    if p.ledger is not None:
        p.ledger.progress(step, s.budget.stepping_seconds)
        records.append(p.ledger.rec)
    billed = sorted(records + watch.others, key=lambda r: r.started_ts) if watch.others else None
    return Books(records, datetime.now(timezone.utc), billed)


# ------------------------------------------------------------------------------------------ the choice


def first_horizon(step: int, decay_start: float) -> int:
    """The shortest horizon whose cooldown begins at ``step`` or later (and trains at least one more step)."""
    t = max(step + 1, math.ceil(step / Fraction(repr(float(decay_start)))))
    while t > step + 1 and decay_begin(t - 1, decay_start) >= step:
        t -= 1  # the float's decimal reading (schedule.horizon_step) is the rule: checked, not assumed
    while decay_begin(t, decay_start) < step:
        t += 1
    return t


@dataclass(frozen=True)
class Choice:
    """What the forecast says at one decision: ``action`` keep | defer | shortened | would lengthen | too late,
    the horizon after it, and the verdicts it rests on (the current horizon's first)."""

    action: str
    horizon: int
    verdicts: tuple[Verdict, ...]
    next_step: int = 0  # defer: the decision the cooldown can wait for


def choose(step: int, horizon: int, planned: int, decay_start: float, next_step: int,
           verdict: Callable[[int], Verdict]) -> Choice:
    """Anytime mode's decision at ``step`` for a run training to ``horizon`` (the config's: ``planned``), whose next
    decision is at ``next_step``; ``verdict(T)`` is the forecast for horizon T."""
    now = verdict(horizon)
    if now.fits:
        if horizon < planned:  # shortened before: the planned horizon may fit again, and is never gone back to
            again = verdict(planned)
            if again.fits:
                return Choice("would lengthen", horizon, (now, again))
        return Choice("keep", horizon, (now,))
    d = decay_begin(horizon, decay_start)
    lo = first_horizon(step, decay_start)
    if step > d or lo >= horizon:  # the cooldown has begun, or begins here already: nothing shorter to start
        return Choice("too late", horizon, (now,))
    hi = horizon - 1
    if next_step <= d:
        later = first_horizon(next_step, decay_start)  # the cooldown begun at the next decision instead
        if later < horizon:
            wait = verdict(later)
            if wait.fits:
                return Choice("defer", horizon, (now, wait), next_step)
            hi = later - 1
    # The longest horizon in [lo, hi] that fits (a longer one bills more and ends later), else the shortest.
    best = lo
    if verdict(lo).fits:
        a, b = lo, hi
        while a < b:
            mid = (a + b + 1) // 2
            a, b = (mid, b) if verdict(mid).fits else (a, mid - 1)
        best = a
    return Choice("shortened", best, (now, verdict(best)))


def next_decision(inp: PlanInput, stop_step: int, ahead: Plan | None = None) -> int:
    """The step of the next decision after ``inp.start_step``: the first checkpoint of the plan's first session
    (a cadence point, else its end), or this session's stop when that comes first. ``ahead``: ``plan(inp)``."""
    first = (ahead or plan(inp)).sessions[0]
    points = [x for x in cadence_points(inp, first.start_step, first.stop_after_steps) if x > inp.start_step]
    nxt = min([*points, first.stop_after_steps])
    return min(nxt, stop_step) if stop_step > inp.start_step else nxt


# ----------------------------------------------------------------------------------------- the session


@dataclass
class Watch:
    """What this session's decisions said last, so a line is logged and booked when the answer turns, not at
    every checkpoint."""

    last: str | None = None
    said: set[str] = field(default_factory=set)
    earlier: list[LedgerRecord] | None = None  # the ledger's other sessions, read once (``books``)
    others: list[LedgerRecord] = field(default_factory=list)  # the run's other lines' sessions, read with them


@dataclass(frozen=True)
class Outcome:
    """A decision as every rank applies it: the new horizon and its record (None: unchanged)."""

    horizon: int | None = None
    shortened: Shortened | None = None


def session_start(s: Session) -> None:
    """All ranks, before the first step: the forecast the ledger keeps (any run that can be planned), then anytime
    mode's decision at the resumed step."""
    _decide(s, s.state.step, start=True)


def before_checkpoint(s: Session, step: int) -> None:
    """All ranks, before the checkpoint at ``step`` is saved: anytime mode's decision, so the checkpoint keeps it."""
    if s.parts.cfg.budget.anytime:
        _decide(s, step, start=False)


def _decide(s: Session, step: int, start: bool) -> None:
    p = s.parts
    b = p.cfg.budget
    if step >= p.total_steps or not b.session_hours:
        return
    out = dist.on_main(lambda: _on_main(s, step, start))
    if out is not None and out.horizon is not None:
        s.set_horizon(out.horizon, out.shortened)


def _on_main(s: Session, step: int, start: bool) -> Outcome | None:
    """Rank 0: the books, the forecast, the decision; its line logged and booked. A forecast that cannot be made
    is said, and the horizon stays."""
    p = s.parts
    cfg, b, watch = p.cfg, p.cfg.budget, s.anytime
    try:
        bk = books(s, step)
        rate, rate_src = measured_rate(bk.records)
        if rate is None:
            _once(watch, "rate", f"anytime: no forecast at step {step} yet ({rate_src}): the horizon stays "
                                 f"{p.total_steps} steps until a session measures one")
            if b.anytime and not cfg.train.ckpt_every and not b.ckpt_minutes:
                # Decisions come before checkpoints: with none along the way, the next is this session's end, too
                # late for a quota that ends inside it to be met with a cooled-down model.
                _once(watch, "cadence", "anytime: no checkpoint cadence (train.ckpt_every = 0, budget.ckpt_minutes = "
                                        "0), so the next decision comes at this session's end, too late to anneal "
                                        "within it should the quota end first: set budget.ckpt_minutes (\"auto\" "
                                        "chooses it) or train.ckpt_every")
            return None
        relay = relay_input(b, p.total_steps, cfg.tokens_per_step, cfg.train.ckpt_every, step, bk.records, rate,
                            rate_src, bk.now, billed=bk.billed)
        if start and p.ledger is not None:
            p.ledger.note(forecast=forecast_note(relay, bk.records))
        if not b.anytime:
            return None
        finish_by = parse_instant(b.finish_by, "budget.finish_by") if b.finish_by else None
        cache: dict[int, Verdict] = {}
        ahead = plan(relay.input)
        # A plan of many sessions costs as many walks per simulated run: fewer runs then, so a decision stays
        # well under a second at every checkpoint.
        runs = max(50, min(RUNS, 20_000 // max(1, len(ahead.sessions))))

        def verdict(t: int) -> Verdict:
            if t not in cache:
                cache[t] = judge(relay, t, b.anytime_confidence, finish_by, runs=runs)
            return cache[t]

        c = choose(step, p.total_steps, cfg.total_steps, cfg.optim.decay_start,
                   next_decision(relay.input, p.stop_step, ahead), verdict)
    except BatonError as e:
        log.warning("anytime: no forecast at step %d (%s); the horizon stays %d steps", step, e, p.total_steps)
        return None
    return _act(s, step, c, relay)


def _act(s: Session, step: int, c: Choice, relay: Relay) -> Outcome | None:
    """Rank 0: the line a choice says (when the answer turned), booked in the ledger; the new horizon, if any."""
    p, watch = s.parts, s.anytime
    cfg = p.cfg
    h, planned, conf = p.total_steps, cfg.total_steps, cfg.budget.anytime_confidence
    now, other = c.verdicts[0], c.verdicts[-1]
    turned, watch.last = watch.last != c.action, c.action
    end = _end_names(cfg.budget)
    if c.action == "keep":
        log.debug("anytime: at step %d the %d-step horizon fits %s (%s)", step, h, end, now.numbers())
        return None
    if c.action == "defer":
        # Inside the warmup there is no plateau yet: the learning rate still climbs to its peak.
        going_on = "the plateau goes on" if step >= cfg.optim.warmup_steps else "the warmup goes on"
        (log.info if turned else log.debug)(
            "anytime: at step %d the %d-step horizon no longer fits %s (%s); %s: a cooldown from step %d (horizon "
            "%d) still fits (%s)", step, h, end, now.numbers(), going_on, c.next_step, other.horizon,
            other.numbers())
        return None
    d = decay_begin(h, cfg.optim.decay_start)
    if c.action == "would lengthen":
        line = (f"anytime: at step {step} the planned {planned}-step horizon fits {end} again ({other.numbers()}); "
                f"it would have trained to {planned} steps, but the run was shortened to {h}, its cooldown from step "
                f"{d}: the horizon stays {h} steps (a shortened run never lengthens)")
    elif c.action == "too late":
        line = (f"anytime: at step {step} the {h}-step horizon does not fit {end} ({now.numbers()}), and its "
                f"cooldown {'has begun' if step > d else 'begins now'} (from step {d}): nothing shorter can start "
                "one; the run goes on to its horizon")
    else:
        d = decay_begin(c.horizon, cfg.optim.decay_start)
        fit = "fits" if other.fits else f"is the shortest possible and still does not fit {label(conf)}"
        line = (f"anytime: at step {step} the {h}-step horizon no longer fits {end} ({now.numbers()}); horizon "
                f"shortened to {c.horizon} steps, its cooldown from step {d} to {c.horizon} (the last "
                f"{1 - cfg.optim.decay_start:.0%} of it), which {fit} ({other.numbers()})")
    if c.action != "shortened" and not turned:
        return None
    (log.warning if c.action == "shortened" else log.info)("%s", line)
    if p.ledger is not None:
        p.ledger.note(event=AnytimeEvent(
            step=step, action=c.action, horizon_from=h, horizon_to=c.horizon, planned=planned, confidence=conf,
            billed_hours=round(other.billed_hours, 6), hours_left=None if other.hours_left is None else
            round(other.hours_left, 6), finish=iso(other.finish), finish_by=iso(other.finish_by) if other.finish_by
            else None, line=line, at=iso(relay.input.start)))
    if c.action != "shortened":
        return None
    return Outcome(c.horizon, Shortened(planned=planned, horizon=c.horizon, step=step, line=line))


def _end_names(budget) -> str:
    parts = [f"budget.cap_hours = {budget.cap_hours:g}" if budget.cap_hours else "",
             f"budget.finish_by = {budget.finish_by}" if budget.finish_by else ""]
    return " and ".join(x for x in parts if x) + f" at {label(budget.anytime_confidence)}"


def _once(watch: Watch, key: str, line: str) -> None:
    if key not in watch.said:
        watch.said.add(key)
        log.info("%s", line)


def start_watch(shortened: Shortened | None) -> Watch:
    """A session's watch: a run shortened before starts with the answer 'no', so the planned horizon fitting
    again is a turn, said once."""
    return Watch(last="shortened" if shortened is not None else None)

