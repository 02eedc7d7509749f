"""The quota ledger: one small JSON object per session, kept in the run's store so it outlives the machine.

``<run>/ledger/<session-id>.json`` is rewritten at the session's start, at every heartbeat (each
checkpoint, and every ``budget.heartbeat_minutes``) and at its end. One object per session, never one
shared appended file, so two sessions (or a dead one) never corrupt each other's record.

Billing is wall clock x accelerators (``bill_factor``) from the session's start to its end, or, for a
session that never recorded an end (killed without warning), to its last heartbeat: a session that
dies still bills, and the bill is a lower bound by at most one heartbeat interval.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import socket
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import Any

from ..errors import BatonError, Fenced, StoreError
from ..runs import BRANCHES, branch_run, branches_in, split_run
from ..store import Store
from .plan import HOUR, Quota, iso

log = logging.getLogger(__name__)

FORMAT = "baton-ledger-v1"
LEDGER_DIR = "ledger"
OPEN = "open"  # outcome of a session that has not recorded its end (running, or died)


def _iso_s(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_session_id(started: float) -> str:
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:24] or "host"
    stamp = datetime.fromtimestamp(started, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{host}-{os.getpid()}-{secrets.token_hex(2)}"


@dataclass
class BookedCheckpoint:
    """A checkpoint cycle a session ran: how long it took and whether the store verified it."""

    step: int
    seconds: float
    verified: bool
    at: str = ""


COMPILE_KINDS = ("off", "cold", "warm")


@dataclass
class StartupSplit:
    """Where a session's start-up went: the command's start to its first step, split in two, and the first step,
    whose excess over the second step is the compile (``train.compile``): cold, or warm from the run's compile
    cache (``train.compile_cache``)."""

    pull: float  # seconds pulling the data, the checkpoint and the compile cache (side by side)
    build: float  # the rest before the first step: imports, set-up, the model, the resume's loading
    first_step: float  # the first step, its compile included
    compile: str = "off"  # off | cold | warm
    compile_seconds: float | None = None  # the first step beyond the second (None: compile off, or one step only)
    note: str | None = None  # what became of the compile cache, in one line

    @property
    def total(self) -> float:
        """The start-up a session pays before it steps at its rate: pull, build and the compile."""
        return self.pull + self.build + (self.compile_seconds or 0.0)

    @classmethod
    def from_json(cls, d: Any) -> StartupSplit:
        if not isinstance(d, dict):
            raise ValueError("startup is not a table")
        for key in ("pull", "build", "first_step", "compile_seconds"):
            v = d.get(key)
            if (v is None and key != "compile_seconds") or (v is not None and (
                    isinstance(v, bool) or not isinstance(v, (int, float)))):
                raise ValueError(f"startup.{key} is not a number of seconds")
        if d.get("compile", "off") not in COMPILE_KINDS:
            raise ValueError(f"startup.compile is not one of {', '.join(COMPILE_KINDS)}")
        note = d.get("note")
        return cls(float(d["pull"]), float(d["build"]), float(d["first_step"]), d.get("compile", "off"),
                   None if d.get("compile_seconds") is None else float(d["compile_seconds"]),
                   note if isinstance(note, str) else None)


@dataclass
class ForecastNote:
    """The relay's forecast from where a session started (``planning.anytime.forecast``): what the plan and the
    simulation predicted then, for ``baton report`` to set beside what happened."""

    step: int  # the step the session started at
    horizon: int  # the horizon it forecast to
    at: str  # when (ISO 8601, UTC)
    plan_eta: str  # `baton plan`'s ETA: no session cut
    p50: str  # the simulated finish at the ledger's interruption rate (`baton simulate`)
    p90: str
    billed_hours_p50: float  # more GPU-hours billed from there
    billed_hours_p90: float

    @classmethod
    def from_json(cls, d: Any) -> ForecastNote:
        kinds: dict[str, type | tuple[type, ...]] = {"step": int, "horizon": int, "billed_hours_p50": (int, float),
                                                      "billed_hours_p90": (int, float)}
        if not isinstance(d, dict) or any(not isinstance(d.get(f.name), kinds.get(f.name, str))
                                          or isinstance(d.get(f.name), bool) for f in fields(cls)):
            raise ValueError("forecast is not a forecast record")
        return cls(step=d["step"], horizon=d["horizon"], at=d["at"], plan_eta=d["plan_eta"], p50=d["p50"],
                   p90=d["p90"], billed_hours_p50=float(d["billed_hours_p50"]),
                   billed_hours_p90=float(d["billed_hours_p90"]))


ANYTIME_ACTIONS = ("shortened", "would lengthen", "too late")


@dataclass
class AnytimeEvent:
    """A decision of anytime mode (``session.anytime``) that changed the horizon or would have, with its numbers."""

    step: int  # where it was decided
    action: str  # shortened | would lengthen (it never does once the cooldown began) | too late (nothing fits)
    horizon_from: int
    horizon_to: int  # the horizon after it (the same as before unless shortened)
    planned: int  # the config's horizon
    confidence: float  # the forecast's (budget.anytime_confidence)
    billed_hours: float | None  # more GPU-hours billed from there to the horizon it judged, at the confidence
    hours_left: float | None  # what budget.cap_hours still left then (None: no cap)
    finish: str | None  # the finish at the confidence (ISO 8601)
    finish_by: str | None  # budget.finish_by (None: none)
    line: str  # the one line logged
    at: str = ""

    @classmethod
    def from_json(cls, d: Any) -> AnytimeEvent:
        if not isinstance(d, dict) or d.get("action") not in ANYTIME_ACTIONS or not isinstance(d.get("line"), str):
            raise ValueError("anytime is not a list of anytime decisions")
        for k in ("step", "horizon_from", "horizon_to", "planned"):
            if type(d.get(k)) is not int:
                raise ValueError(f"anytime: {k} is not a step")
        for k in ("confidence", "billed_hours", "hours_left"):
            v = d.get(k)
            if (v is not None or k == "confidence") and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ValueError(f"anytime: {k} is not a number")
        for k in ("finish", "finish_by", "at"):
            if d.get(k) is not None and not isinstance(d[k], str):
                raise ValueError(f"anytime: {k} is not a time")
        def number(k: str) -> float | None:
            return None if d.get(k) is None else float(d[k])

        return cls(step=d["step"], action=d["action"], horizon_from=d["horizon_from"], horizon_to=d["horizon_to"],
                   planned=d["planned"], confidence=float(d["confidence"]), billed_hours=number("billed_hours"),
                   hours_left=number("hours_left"), finish=d.get("finish"), finish_by=d.get("finish_by"),
                   line=d["line"], at=d.get("at") or "")


@dataclass
class LedgerRecord:
    """One session's record, ``<run>/ledger/<session>.json``: the one definition its writer and readers share."""

    session: str
    run: str
    started_ts: float
    started: str = ""
    host: str = ""
    pid: int = 0
    device: str | None = None
    accelerators: int = 1
    bill_factor: float = 1.0
    heartbeat: str = ""
    heartbeat_ts: float | None = None
    ended: str | None = None
    ended_ts: float | None = None
    outcome: str = OPEN
    steps_from: int | None = None  # the step it resumed at (None: it trained no steps of the run, e.g. preflight)
    steps_to: int | None = None  # the newest step it reached (a killed one: at its last heartbeat)
    tokens_per_step: int = 0
    stepping_seconds: float = 0.0
    tokens_per_s: float | None = None  # its measured stepping rate
    checkpoints: list[BookedCheckpoint] = field(default_factory=list)
    deadline: str | None = None
    deadline_ts: float | None = None
    heartbeat_every_s: float = 0.0
    billed_hours: float = 0.0  # as of its last write; readers recompute it (``billed_hours``)
    data: dict[str, Any] | None = None  # where the data came from and how long the pull took (data.pull)
    startup_seconds: float | None = None  # command start to first step (until split: to the resumed state)
    startup: StartupSplit | None = None  # pull, build, compile and first step (older records have none)
    kind: str | None = None  # "preflight:<stage>" for a preflight stage's session
    slurm_job: str | None = None  # the SLURM job it ran in (SLURM_JOB_ID); None outside SLURM
    slurm_array_task: int | None = None  # its index in a job array (SLURM_ARRAY_TASK_ID)
    slurm_restarts: int | None = None  # times the job had been requeued before this session (SLURM_RESTART_COUNT)
    requeued: bool = False  # it ended by requeueing its SLURM job for the next session (train.requeue)
    # How each "auto" setting resolved on this session's machine: setting -> "auto -> value (why)"
    settings: dict[str, str] = field(default_factory=dict)
    epoch: int | None = None  # the run's lease epoch it held (store.lease); None: it held none
    took_over: dict[str, Any] | None = None  # the session it took the lease from: {"session", "host", "epoch", "why"}
    # The cooldown branch it trained (``baton anneal``: anneal-<step>-<tokens>); None: the main run. Billed against
    # the same quota and cap as the main run's sessions.
    branch: str | None = None
    forecast: ForecastNote | None = None  # the relay's forecast when it started (None: it could make none)
    anytime: list[AnytimeEvent] = field(default_factory=list)  # anytime mode's decisions in it (budget.anytime)

    @property
    def last_ts(self) -> float:
        """Where its billing ends: its end, or its last heartbeat when it recorded none (killed)."""
        return self.ended_ts or self.heartbeat_ts or self.started_ts

    def verified_steps(self) -> set[int]:
        return {c.step for c in self.checkpoints if c.verified}

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, d: Any) -> LedgerRecord:
        """The record in ``d`` (parsed JSON); ValueError naming what is wrong."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError("not a baton ledger record")
        for key, kinds in (("session", str), ("run", str), ("started_ts", (int, float))):
            if not isinstance(d.get(key), kinds) or isinstance(d.get(key), bool):
                raise ValueError(f"{key} is missing or not a {getattr(kinds, '__name__', 'number')}")
        for key in ("heartbeat_ts", "ended_ts", "bill_factor", "stepping_seconds", "tokens_per_s", "startup_seconds"):
            v = d.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ValueError(f"{key} is not a number")
        for key in ("steps_from", "steps_to", "slurm_array_task", "slurm_restarts"):
            if d.get(key) is not None and type(d[key]) is not int:
                raise ValueError(f"{key} is not a {'step' if key.startswith('steps') else 'whole number'}")
        if d.get("slurm_job") is not None and not isinstance(d["slurm_job"], str):
            raise ValueError("slurm_job is not a job id")
        if not isinstance(d.get("requeued", False), bool):
            raise ValueError("requeued is not true or false")
        settings = d.get("settings") or {}
        if not isinstance(settings, dict) or not all(isinstance(v, str) for v in settings.values()):
            raise ValueError("settings is not a table of resolved settings")
        if d.get("epoch") is not None and type(d["epoch"]) is not int:
            raise ValueError("epoch is not a whole number")
        if d.get("took_over") is not None and not isinstance(d["took_over"], dict):
            raise ValueError("took_over is not a table")
        if d.get("branch") is not None and not isinstance(d["branch"], str):
            raise ValueError("branch is not a branch name")
        booked = d.get("checkpoints") or []
        if not isinstance(booked, list) or not all(isinstance(c, dict) and type(c.get("step")) is int for c in booked):
            raise ValueError("checkpoints is not a list of checkpoint records")
        if d.get("anytime") is not None and not isinstance(d["anytime"], list):
            raise ValueError("anytime is not a list of anytime decisions")
        startup = StartupSplit.from_json(d["startup"]) if d.get("startup") is not None else None
        known = {f.name for f in fields(cls)}
        rec = cls(**{k: v for k, v in d.items()
                     if k in known and k not in ("checkpoints", "forecast", "anytime", "startup")})
        rec.forecast = ForecastNote.from_json(d["forecast"]) if d.get("forecast") is not None else None
        rec.anytime = [AnytimeEvent.from_json(e) for e in d.get("anytime") or []]
        rec.startup = startup
        rec.checkpoints = [BookedCheckpoint(c["step"], float(c.get("seconds") or 0.0), c.get("verified") is True,
                                            str(c.get("at", ""))) for c in booked]
        if rec.bill_factor is None:
            rec.bill_factor = 1.0
        return rec


def billed_hours(rec: LedgerRecord) -> float:
    """Hours billed by one record: start to end, or to the last heartbeat when there is no end."""
    return max(0.0, rec.last_ts - rec.started_ts) / HOUR * rec.bill_factor


class SessionLedger:
    """This session's record. Only rank 0 holds one; a failed write warns and never stops training."""

    def __init__(self, store: Store, run: str, started: float, device: str, accelerators: int,
                 bill_factor: float, tokens_per_step: int, deadline: float | None = None,
                 heartbeat_every_s: float = 0.0, data: dict[str, Any] | None = None,
                 slurm: tuple[str, int | None, int] | None = None, session: str | None = None,
                 epoch: int | None = None, took_over: dict[str, Any] | None = None):
        """``slurm``: (job id, array index, requeues so far) of the SLURM job the session runs in. ``session``: its
        id, when made before (the lease names it); ``epoch``, ``took_over``: the run's lease it holds."""
        self.store = store
        self.run = run
        self.id = session or new_session_id(started)
        self.key = ledger_key(run, self.id)
        self.heartbeat_every_s = heartbeat_every_s
        self.rec = LedgerRecord(
            session=self.id, run=run, host=socket.gethostname(), pid=os.getpid(), device=device,
            accelerators=accelerators, bill_factor=bill_factor, started=_iso_s(started), started_ts=started,
            heartbeat=_iso_s(started), heartbeat_ts=started, tokens_per_step=tokens_per_step,
            deadline=_iso_s(deadline) if deadline else None, deadline_ts=deadline,
            heartbeat_every_s=heartbeat_every_s, data=data, epoch=epoch, took_over=took_over,
            branch=split_run(run)[1])
        if slurm is not None:
            self.rec.slurm_job, self.rec.slurm_array_task, self.rec.slurm_restarts = slurm
        self._last_write = 0.0
        self.ok = self._write()

    def _write(self) -> bool:
        self.rec.billed_hours = round(billed_hours(self.rec), 6)
        text = json.dumps(self.rec.to_json(), indent=1)
        try:
            try:
                self.store.write_text(self.key, text)
            except Fenced:
                # The one record a fenced session still writes is its own (its end, saying so), never the run's.
                unchained = getattr(self.store, "unchained", None)
                if unchained is None:
                    raise
                unchained().write_text(self.key, text)
        except (StoreError, OSError) as e:
            log.warning("could not write the ledger record %s (%s); this session's hours are not recorded "
                        "there until a later write succeeds", self.key, e)
            return False
        self._last_write = time.time()
        return True

    def progress(self, step: int, stepping_seconds: float, now: float | None = None) -> None:
        r = self.rec
        now = time.time() if now is None else now
        r.steps_to = step
        r.stepping_seconds = round(stepping_seconds, 4)
        if r.steps_from is not None and stepping_seconds > 0 and step > r.steps_from:
            r.tokens_per_s = round((step - r.steps_from) * r.tokens_per_step / stepping_seconds, 3)
        r.heartbeat, r.heartbeat_ts = _iso_s(now), now

    def resumed(self, step: int) -> None:
        now = time.time()
        self.rec.steps_from = self.rec.steps_to = step
        # From the command's start to the first step: data pull, checkpoint pull, model build (measured startup).
        self.rec.startup_seconds = round(max(0.0, now - self.rec.started_ts), 3)
        # A heartbeat too: a session killed before its first one is billed its start-up (a long pull), not nothing.
        self.rec.heartbeat, self.rec.heartbeat_ts = _iso_s(now), now
        self._write()

    def started_stepping(self, split: StartupSplit) -> None:
        """The start-up as measured at the first steps; written with the record's next write (a heartbeat, a
        checkpoint, the end), not one of its own."""
        self.rec.startup = split
        self.rec.startup_seconds = round(split.pull + split.build, 3)

    def heartbeat(self, step: int, stepping_seconds: float) -> bool:
        self.progress(step, stepping_seconds)
        return self._write()

    def heartbeat_due(self, now: float) -> bool:
        return self.heartbeat_every_s > 0 and now - self._last_write >= self.heartbeat_every_s

    def checkpoint(self, step: int, seconds: float, verified: bool, stepping_seconds: float) -> None:
        self.rec.checkpoints.append(BookedCheckpoint(step, round(seconds, 3), verified, _iso_s(time.time())))
        self.heartbeat(step, stepping_seconds)

    def note(self, forecast: ForecastNote | None = None, event: AnytimeEvent | None = None) -> bool:
        """The relay's forecast at the session's start, or one of anytime mode's decisions, written at once."""
        if forecast is not None:
            self.rec.forecast = forecast
        if event is not None:
            self.rec.anytime.append(event)
        return self._write()

    def end(self, outcome: str, step: int | None, stepping_seconds: float, requeued: bool = False) -> None:
        now = time.time()
        self.rec.requeued = requeued
        if step is not None:
            self.progress(step, stepping_seconds, now)
        self.rec.ended, self.rec.ended_ts, self.rec.outcome = _iso_s(now), now, outcome
        self._write()


# ---------------------------------------------------------------------------------------- reading


def list_keys(store: Store, prefix: str) -> list[str]:
    try:
        listing = store.list(prefix, checksums=False)
    except TypeError:  # a backend without the checksums switch
        listing = store.list(prefix)
    return sorted(listing)


def ledger_key(run: str, session: str) -> str:
    return f"{run}/{LEDGER_DIR}/{session}.json"


def read_ledger(store: Store, run: str) -> tuple[list[LedgerRecord], list[str]]:
    """(records sorted by start, problems). A damaged record is reported, never fatal."""
    records, problems = [], []
    for key in list_keys(store, f"{run}/{LEDGER_DIR}/"):
        if not key.endswith(".json"):
            continue
        try:
            text = store.read_text(key)
            if text is None:
                raise ValueError("listed, then not found")
            records.append(LedgerRecord.from_json(json.loads(text)))
        except (ValueError, TypeError, StoreError) as e:
            problems.append(f"{key}: {e}")
    # Sessions started in the same second (one process running several) are told apart by their first step.
    records.sort(key=lambda r: (r.started_ts, r.steps_from or 0))
    return records, problems


def branch_runs(store: Store, run: str) -> list[str]:
    """The run names of ``run``'s cooldown branches in the store (``<run>/branches/<name>``), by branch point."""
    main = split_run(run)[0]
    return [branch_run(main, b) for b in branches_in(list_keys(store, f"{main}/{BRANCHES}/"), main)]


def read_run_ledgers(store: Store, run: str, read: tuple[list[LedgerRecord], list[str]] | None = None
                     ) -> tuple[list[LedgerRecord], list[str]]:
    """Every session billed to the run: its main run's and each of its cooldown branches' (``run`` may name either),
    sorted by start. What a quota, a cap and a plan count. ``read``: ``read_ledger(store, run)``, when the caller
    has it already."""
    main = split_run(run)[0]
    records: list[LedgerRecord] = []
    problems: list[str] = []
    for r_name in (main, *branch_runs(store, main)):
        r, p = read if read is not None and r_name == run else read_ledger(store, r_name)
        records += r
        problems += p
    records.sort(key=lambda r: (r.started_ts, r.steps_from or 0))
    return records, problems


def hours_between(rec: LedgerRecord, a: datetime, b: datetime) -> float:
    """The part of a record's billed time that falls inside [a, b) (platforms meter continuously)."""
    lo = max(rec.started_ts, a.timestamp())
    hi = min(rec.last_ts, b.timestamp())
    return max(0.0, hi - lo) / HOUR * rec.bill_factor


@dataclass
class Totals:
    billed_hours: float
    sessions: int
    open_sessions: int
    period_hours: float | None  # billed in the current quota period
    period_start: datetime | None
    period_end: datetime | None
    quota_hours: float
    quota_left: float | None
    cap_hours: float
    cap_left: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"billed_hours": self.billed_hours, "sessions": self.sessions, "open_sessions": self.open_sessions,
                "period_hours": self.period_hours,
                "period_start": iso(self.period_start) if self.period_start else None,
                "period_end": iso(self.period_end) if self.period_end else None,
                "quota_hours": self.quota_hours, "quota_left": self.quota_left,
                "cap_hours": self.cap_hours, "cap_left": self.cap_left}


def quota_from(budget: Any, now: datetime | None = None) -> Quota | None:
    """The config's quota (``[budget]``), or None when it sets none."""
    if not budget.quota_hours:
        return None
    from .plan import parse_instant

    reset = parse_instant(budget.quota_reset, "budget.quota_reset") if budget.quota_reset else None
    if reset is None:
        raise BatonError("budget.quota_hours is set but budget.quota_reset is not (an instant at which the quota "
                         "resets, e.g. 2026-09-26T00:00Z)")
    return Quota(budget.quota_hours, timedelta(days=budget.quota_period_days), reset)


def totals(records: list[LedgerRecord], quota: Quota | None = None, cap_hours: float = 0.0,
           now: datetime | None = None) -> Totals:
    now = now or datetime.now(timezone.utc)
    billed = sum(billed_hours(r) for r in records)
    period_hours = start = end = quota_left = None
    if quota is not None:
        start = quota.period_start(now)
        end = start + quota.period
        period_hours = sum(hours_between(r, start, end) for r in records)
        quota_left = quota.hours - period_hours
    return Totals(billed, len(records), sum(1 for r in records if r.outcome == OPEN), period_hours, start,
                  end, quota.hours if quota else 0.0, quota_left, cap_hours,
                  (cap_hours - billed) if cap_hours else None)


def measured_rate(records: list[LedgerRecord]) -> tuple[float | None, str]:
    """The stepping rate of the most recent session that measured one (tokens/s), and where it came from."""
    for rec in reversed(records):
        if rec.tokens_per_s:
            return float(rec.tokens_per_s), f"session {rec.session}"
    return None, "no session has measured a rate yet"


def startup_seconds(records: list[LedgerRecord], last: int = 3) -> tuple[float | None, str]:
    """The start-up a session reserves before stepping (command start to its first step, and the compile in that
    step), and what it is made of: among the last few training sessions that measured one, the slowest of those
    that compiled warm from the run's compile cache (what every session after a relay's first does), else the
    slowest of them all."""
    seen = [r for r in records if r.startup_seconds is not None][-last:]
    if not seen:
        return None, "no session has measured its startup yet"
    warm = [r for r in seen if r.startup is not None and r.startup.compile == "warm"]
    worst = max(warm or seen, key=full_startup)
    split, pull = worst.startup, (worst.data or {}).get("seconds")
    if split is not None:
        # The data's own pull first (the ledger's data record), then every pull together (data, checkpoint and
        # compile cache side by side), the build and the compile.
        parts = (f"data pull {pull:.1f} s, all pulls {split.pull:.1f} s" if pull is not None else
                 f"pull {split.pull:.1f} s") + f", build {split.build:.1f} s" + (
            f", compile {split.compile_seconds:.1f} s {split.compile}" if split.compile_seconds is not None
            else f", compile {split.compile}")
        return full_startup(worst), f"measured{' warm' if warm else ''} (ledger, session {worst.session}: {parts})"
    return full_startup(worst), (f"measured (ledger, session {worst.session}"
                                 + (f": data pull {pull:.1f} s of it" if pull is not None else "") + ")")


def full_startup(rec: LedgerRecord) -> float:
    """A record's start-up: its split's total (compile included) where it has one, else what it measured."""
    return rec.startup.total if rec.startup is not None else float(rec.startup_seconds or 0.0)


def checkpoint_seconds(records: list[LedgerRecord], last: int = 3) -> float | None:
    """The slowest checkpoint cycle among the last few sessions: the time a final checkpoint needs."""
    seen = [c.seconds for rec in records[-last:] for c in rec.checkpoints if c.verified]
    return max(seen) if seen else None


def checkpoint_cycle(configured: float, records: list[LedgerRecord]) -> tuple[float | None, str]:
    """The checkpoint cycle a plan, a simulation and the status use, and the one label of where it came from:
    ``budget.ckpt_seconds`` when set, else the slowest the ledger measured, else unknown."""
    if configured:
        return float(configured), "config"
    seconds = checkpoint_seconds(records)
    return seconds, "measured (ledger)" if seconds is not None else "unknown: 0"


def startup_figure(configured_minutes: float, records: list[LedgerRecord]) -> tuple[float | None, str]:
    """The startup a session reserves (seconds) and where it came from: ``budget.startup_minutes`` when set,
    else the ledger's measurement."""
    if configured_minutes:
        return configured_minutes * 60, "config"
    return startup_seconds(records)


def verified_steps(records: list[LedgerRecord]) -> set[int]:
    """Every step whose checkpoint a session booked as verified."""
    return {s for r in records for s in r.verified_steps()}


def takeover_note(took_over: dict[str, Any] | None) -> str:
    """What a record's ``took_over`` says, as the ledger and the report print it after the outcome ("" if none)."""
    if not took_over:
        return ""
    why = {"expired": "its lease had expired", "gone": "its process had ended"}.get(str(took_over.get("why")),
                                                                                  "with --take-over")
    return (f"; took the run over from {took_over.get('session')} on {took_over.get('host')} (epoch "
            f"{took_over.get('epoch')}, {why})")


def format_ledger(records: list[LedgerRecord], t: Totals) -> str:
    lines = ["| session | started | last heartbeat | ended | billed h | outcome | steps | device |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        # A preflight stage's record trains no steps of the run: no range, not "None → None".
        steps = "—" if r.steps_from is None else f"{r.steps_from} → {r.steps_to}"
        steps += f" (branch {r.branch})" if r.branch else ""
        outcome = r.outcome if r.outcome != OPEN else "no end recorded (running, or died: billed to heartbeat)"
        outcome += takeover_note(r.took_over)
        lines.append(f"| {r.session} | {r.started} | {r.heartbeat} | {r.ended or '—'} | "
                     f"{billed_hours(r):.4f} | {outcome} | {steps} | {r.device} x{r.bill_factor} |")
    lines.append("")
    lines.append(f"total billed: {t.billed_hours:.4f} h over {t.sessions} sessions"
                 + (f" ({t.open_sessions} without a recorded end)" if t.open_sessions else ""))
    if t.period_hours is not None:
        # totals() sets the period's hours, start and end together, from the quota
        assert t.period_start is not None and t.period_end is not None
        over = "  OVER THE QUOTA" if t.quota_left is not None and t.quota_left < 0 else ""
        lines.append(f"this quota period ({iso(t.period_start)} → {iso(t.period_end)}): {t.period_hours:.4f} h of "
                     f"{t.quota_hours:g} h, {t.quota_left:.4f} h left{over}")
    if t.cap_left is not None:
        over = "  OVER THE CAP" if t.cap_left < 0 else ""
        lines.append(f"cap: {t.billed_hours:.4f} h of {t.cap_hours:g} h, {t.cap_left:.4f} h left{over}")
    return "\n".join(lines)
