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
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from ..errors import BatonError, StoreError
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


def billed_hours(rec: dict[str, Any]) -> float:
    """Hours billed by one record: start to end, or to the last heartbeat when there is no end."""
    last = rec.get("ended_ts") or rec.get("heartbeat_ts") or rec["started_ts"]
    return max(0.0, last - rec["started_ts"]) / HOUR * rec.get("bill_factor", 1.0)


class SessionLedger:
    """This session's record. Only rank 0 holds one; a failed write warns and never stops training."""

    def __init__(self, store: Store, run: str, started: float, device: str, accelerators: int,
                 bill_factor: float, tokens_per_step: int, deadline: float | None = None,
                 heartbeat_every_s: float = 0.0, data: dict[str, Any] | None = None):
        self.store = store
        self.run = run
        self.id = new_session_id(started)
        self.key = ledger_key(run, self.id)
        self.heartbeat_every_s = heartbeat_every_s
        self.rec: dict[str, Any] = {
            "format": FORMAT, "session": self.id, "run": run, "host": socket.gethostname(), "pid": os.getpid(),
            "device": device, "accelerators": accelerators, "bill_factor": bill_factor,
            "started": _iso_s(started), "started_ts": started, "heartbeat": _iso_s(started), "heartbeat_ts": started,
            "ended": None, "ended_ts": None, "outcome": OPEN, "steps_from": None, "steps_to": None,
            "tokens_per_step": tokens_per_step, "stepping_seconds": 0.0, "tokens_per_s": None,
            "checkpoints": [], "deadline": _iso_s(deadline) if deadline else None, "deadline_ts": deadline,
            "heartbeat_every_s": heartbeat_every_s, "billed_hours": 0.0,
            # where the data came from and how long making it present took (baton.data.pull), if pulled
            "data": data, "startup_seconds": None,
        }
        self._last_write = 0.0
        self.ok = self._write()

    def _write(self) -> bool:
        self.rec["billed_hours"] = round(billed_hours(self.rec), 6)
        try:
            self.store.write_text(self.key, json.dumps(self.rec, indent=1))
        except (StoreError, OSError) as e:
            log.warning("could not write the ledger record %s (%s); this session's hours are not recorded "
                        "there until a later write succeeds", self.key, e)
            return False
        self._last_write = time.time()
        return True

    def progress(self, step: int, stepping_seconds: float, now: float | None = None) -> None:
        r = self.rec
        now = time.time() if now is None else now
        r["steps_to"] = step
        r["stepping_seconds"] = round(stepping_seconds, 4)
        if r["steps_from"] is not None and stepping_seconds > 0 and step > r["steps_from"]:
            r["tokens_per_s"] = round((step - r["steps_from"]) * r["tokens_per_step"] / stepping_seconds, 3)
        r["heartbeat"], r["heartbeat_ts"] = _iso_s(now), now

    def resumed(self, step: int) -> None:
        self.rec["steps_from"] = self.rec["steps_to"] = step
        # From the command's start to the first step: data pull, checkpoint pull, model build (measured startup).
        self.rec["startup_seconds"] = round(max(0.0, time.time() - self.rec["started_ts"]), 3)
        self._write()

    def heartbeat(self, step: int, stepping_seconds: float) -> bool:
        self.progress(step, stepping_seconds)
        return self._write()

    def heartbeat_due(self, now: float) -> bool:
        return self.heartbeat_every_s > 0 and now - self._last_write >= self.heartbeat_every_s

    def checkpoint(self, step: int, seconds: float, verified: bool, stepping_seconds: float) -> None:
        self.rec["checkpoints"].append({"step": step, "seconds": round(seconds, 3), "verified": verified,
                                        "at": _iso_s(time.time())})
        self.heartbeat(step, stepping_seconds)

    def end(self, outcome: str, step: int | None, stepping_seconds: float) -> None:
        now = time.time()
        if step is not None:
            self.progress(step, stepping_seconds, now)
        self.rec["ended"], self.rec["ended_ts"], self.rec["outcome"] = _iso_s(now), now, outcome
        self._write()


# ---------------------------------------------------------------------------------------- reading


def _keys(store: Store, prefix: str) -> list[str]:
    try:
        listing = store.list(prefix, checksums=False)
    except TypeError:  # a backend without the checksums switch
        listing = store.list(prefix)
    return sorted(listing)


def ledger_key(run: str, session: str) -> str:
    return f"{run}/{LEDGER_DIR}/{session}.json"


def read_ledger(store: Store, run: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(records sorted by start, problems). A damaged record is reported, never fatal."""
    records, problems = [], []
    for key in _keys(store, f"{run}/{LEDGER_DIR}/"):
        if not key.endswith(".json"):
            continue
        try:
            text = store.read_text(key)
            rec = json.loads(text) if text is not None else None
            if not isinstance(rec, dict) or rec.get("format") != FORMAT or "started_ts" not in rec:
                raise ValueError("not a baton ledger record")
        except (ValueError, StoreError) as e:
            problems.append(f"{key}: {e}")
            continue
        records.append(rec)
    records.sort(key=lambda r: r["started_ts"])
    return records, problems


def hours_between(rec: dict[str, Any], a: datetime, b: datetime) -> float:
    """The part of a record's billed time that falls inside [a, b) (platforms meter continuously)."""
    last = rec.get("ended_ts") or rec.get("heartbeat_ts") or rec["started_ts"]
    lo = max(rec["started_ts"], a.timestamp())
    hi = min(last, b.timestamp())
    return max(0.0, hi - lo) / HOUR * rec.get("bill_factor", 1.0)


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


def totals(records: list[dict[str, Any]], quota: Quota | None = None, cap_hours: float = 0.0,
           now: datetime | None = None) -> Totals:
    now = now or datetime.now(timezone.utc)
    billed = sum(billed_hours(r) for r in records)
    period_hours = start = end = quota_left = None
    if quota is not None:
        start = quota.period_start(now)
        end = start + quota.period
        period_hours = sum(hours_between(r, start, end) for r in records)
        quota_left = quota.hours - period_hours
    return Totals(billed, len(records), sum(1 for r in records if r.get("outcome") == OPEN), period_hours, start,
                  end, quota.hours if quota else 0.0, quota_left, cap_hours,
                  (cap_hours - billed) if cap_hours else None)


def measured_rate(records: list[dict[str, Any]]) -> tuple[float | None, str]:
    """The stepping rate of the most recent session that measured one (tokens/s), and where it came from."""
    for rec in reversed(records):
        if rec.get("tokens_per_s"):
            return float(rec["tokens_per_s"]), f"session {rec['session']}"
    return None, "no session has measured a rate yet"


def startup_seconds(records: list[dict[str, Any]], last: int = 3) -> tuple[float | None, str]:
    """The slowest startup (command start to first step) among the last few training sessions that measured
    one, and what it is made of: the budget a session must reserve before stepping."""
    seen = [r for r in records if r.get("startup_seconds") is not None][-last:]
    if not seen:
        return None, "no session has measured its startup yet"
    worst = max(seen, key=lambda r: r["startup_seconds"])
    pull = (worst.get("data") or {}).get("seconds")
    return float(worst["startup_seconds"]), (f"measured (ledger, session {worst['session']}"
                                             + (f": data pull {pull:.1f} s of it" if pull is not None else "") + ")")


def checkpoint_seconds(records: list[dict[str, Any]], last: int = 3) -> float | None:
    """The slowest checkpoint cycle among the last few sessions: the time a final checkpoint needs."""
    seen = [c["seconds"] for rec in records[-last:] for c in rec.get("checkpoints", []) if c.get("verified")]
    return max(seen) if seen else None


def format_ledger(records: list[dict[str, Any]], t: Totals) -> str:
    lines = ["| session | started | last heartbeat | ended | billed h | outcome | steps | device |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        # A preflight stage's record trains no steps of the run: no range, not "None → None".
        steps = "—" if r.get("steps_from") is None else f"{r['steps_from']} → {r.get('steps_to')}"
        outcome = r["outcome"] if r["outcome"] != OPEN else "no end recorded (running, or died: billed to heartbeat)"
        lines.append(f"| {r['session']} | {r['started']} | {r['heartbeat']} | {r.get('ended') or '—'} | "
                     f"{billed_hours(r):.4f} | {outcome} | {steps} | {r.get('device')} x{r.get('bill_factor')} |")
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
