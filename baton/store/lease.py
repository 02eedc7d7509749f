"""One writer per run: ``<run>/lease`` in the store, taken and renewed by conditional writes only.

A session acquires the lease before it writes anything to the run and renews it from a thread of its own,
never from the training step. The lease names its holder (session, host, pid, start), an **epoch** that
only grows (the fencing token: every takeover adds one) and how long it lives without a renewal
(``ttl_s``). Acquiring, renewing, taking over and releasing are all ``Store.write_if`` on the version last
seen, so of two sessions racing for one run exactly one wins and the other reads the winner's record.

Expiry never compares two machines' clocks. Where the store tells an object's age by its own clock (a local
or mounted folder: the file system's stamps; S3: Last-Modified against the answer's Date) the lease has
expired when that age reaches ``ttl_s``. Where it does not (the Hub, or a stamp ahead of the store's clock),
a contender watches the lease for ``ttl_s`` seconds of its own clock: a lease that nobody renews in that time
has expired.

The holder keeps itself honest the same way: once ``ttl_s`` has passed on its own clock (one that counts
through a suspend) since the start of its last successful renewal (a paused process or VM, a store it cannot
reach), it counts itself fenced,
since another session may now rightly hold the run. A renewal refused because another session took the
lease over fences it too. A fenced session writes nothing more to the run (``FencedStore``).

The lease also guards the run's pointer: ``roll`` writes the pointer only on the version this session last
saw, and acquiring the lease *seals* the pointer (rewrites it with the new epoch), so a session fenced
before its pointer write landed can never move the pointer afterwards.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import faults
from ..errors import Fenced, LeaseHeld, StoreError, WriteConflict
from ..guard import shown
from ..runs import split_run
from .base import Store, Versioned

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def _awake_clock() -> float:
    """Seconds on a clock that keeps counting while the machine sleeps (Linux's CLOCK_BOOTTIME; elsewhere the
    monotonic clock): a holder whose VM was suspended past its lease must find it lapsed on waking, and the
    monotonic clock stands still through a suspend."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()

log = logging.getLogger(__name__)

LEASE = "lease"
FORMAT = "baton-lease-v1"
TAKE_OVER_HINT = "`baton train --take-over` (train(..., take_over=True) in Python)"
ANNEAL_TAKE_OVER_HINT = "the same `baton anneal` with --take-over (anneal(..., take_over=True) in Python)"
# Why a session took the lease from another, as the log and the ledger say it.
WHY = {"expired": "its lease had expired", "gone": "its process had ended on this machine",
       "--take-over": "asked with --take-over"}


def this_machine() -> str | None:
    """This boot of this machine and this process namespace: processes that share it see one process table, so
    one of them can tell for certain that another has ended. None where that cannot be told (not Linux)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None when no live process has that id: a pid
    reused by a later process has another start, and a zombie counts as ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of proc(5), counted from the state (field 3)


def lease_key(run: str) -> str:
    return f"{run}/{LEASE}"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class LeaseRecord:
    """What ``<run>/lease`` holds. Times are the holder's clock, for people to read; expiry is judged by the
    store's (``Versioned.age``) or by watching for a renewal, never from these."""

    session: str
    host: str
    pid: int
    started: str
    epoch: int
    ttl_s: float
    renewals: int = 0
    renewed: str = ""
    released: bool = False
    took_over: dict[str, Any] | None = None  # {"session", "host", "epoch", "why"}: whom this holder replaced
    machine: str | None = None  # this_machine() of the holder: a session there can tell the holder has ended
    proc_start: int | None = None  # the holder's process_start

    def ended(self) -> bool:
        """Its process has ended, as told for certain on the holder's own machine (False anywhere else)."""
        mine = this_machine()
        return mine is not None and self.machine == mine and process_start(self.pid) != self.proc_start

    def to_text(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=1, sort_keys=True)

    @classmethod
    def from_text(cls, text: str, key: str) -> LeaseRecord:
        try:
            d = json.loads(text)
            if not isinstance(d, dict) or d.get("format") != FORMAT:
                raise ValueError("not a baton lease")
            if type(d.get("epoch")) is not int or d["epoch"] < 1:
                raise ValueError("its epoch is not a whole number >= 1")
            ttl = d.get("ttl_s")
            # store.lease_seconds' own range: NaN, an infinity or a century would hold the run against every start
            if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= 3600:
                raise ValueError(f"its ttl_s {shown(ttl, 40)} is not a number of seconds in (0, 3600]")
            for name in ("pid", "renewals"):
                if name in d and (type(d[name]) is not int or d[name] < 0):
                    raise ValueError(f"its {name} {shown(d[name], 40)} is not a whole number >= 0")
            return cls(session=str(d["session"]), host=str(d["host"]), pid=d["pid"], started=str(d["started"]),
                       epoch=d["epoch"], ttl_s=float(ttl), renewals=d.get("renewals", 0),
                       renewed=str(d.get("renewed", "")), released=d.get("released") is True,
                       took_over=d.get("took_over") if isinstance(d.get("took_over"), dict) else None,
                       machine=d["machine"] if isinstance(d.get("machine"), str) else None,
                       proc_start=d["proc_start"] if type(d.get("proc_start")) is int else None)
        except (ValueError, TypeError, KeyError) as e:
            raise StoreError(f"the lease {key} is damaged ({e}); delete it once no session of the run is running, "
                             "then start again") from None

    def holder(self) -> str:
        return f"session {self.session} on host {self.host} (pid {self.pid})"


def refusal(run: str, rec: LeaseRecord, age: float | None) -> str:
    """The one line a second session gets: who holds the run, since when, when the lease expires, the ways on."""
    if age is not None:
        left = max(0.0, rec.ttl_s - age)
        renewed = f"last renewed {rec.renewed or rec.started} ({age:.0f} s ago by the store's clock)"
        expires = f"the lease expires in {left:.0f} s unless renewed"
    else:
        renewed = f"last renewed {rec.renewed or rec.started} (renewed while this session watched)"
        expires = f"the lease expires {rec.ttl_s:.0f} s after its last renewal"
    hint = ANNEAL_TAKE_OVER_HINT if split_run(run)[1] is not None else TAKE_OVER_HINT  # a cooldown branch's session
    return (f"run {run!r} is being trained by {rec.holder()}, since {rec.started}, {renewed}; {expires}. "
            f"Wait for that session to end (or its lease to expire), or run {hint} to take the run over: "
            "that session is then fenced and stops at its next write")


def refuse_if_held(store: Store, run: str) -> None:
    """One read, before a session spends minutes on its set-up (the dataset's pull, the micro-batch probe): raise
    LeaseHeld when the run's lease is live by the store's clock, with the words ``Lease.acquire`` would use.
    Where the store tells no age (the Hub) or the holder may be gone, nothing is decided here: ``acquire``
    judges it when the session takes the lease."""
    # The record first, read as text: a released lease (the common case) is known free without asking the store's
    # clock, which on a folder is a file touched, and a session that goes no further leaves the store as it was.
    text = store.read_text(lease_key(run))
    if text is None:
        return
    rec = LeaseRecord.from_text(text, lease_key(run))
    if rec.released or rec.ended():
        return
    found = read_lease(store, run)
    if found is None:
        return
    rec, age = found
    if not rec.released and not rec.ended() and age is not None and age < rec.ttl_s:
        raise LeaseHeld(refusal(run, rec, age))


class Lease:
    """This session's hold on the run (rank 0 only). ``acquire`` once, then ``start`` the renewals; ``check``
    (no request) before every write, ``verify`` (one read) before irreversible ones; ``release`` at a clean
    end."""

    def __init__(self, store: Store, run: str, session: str, ttl_s: float, started: float | None = None,
                 clock: Callable[[], float] = _awake_clock, sleep: Callable[[float], None] = time.sleep):
        self.store = store
        self.run = run
        self.key = lease_key(run)
        self.ttl_s = float(ttl_s)
        self.session = session
        self._clock = clock
        self._sleep = sleep
        self._started = started if started is not None else time.time()
        self.record: LeaseRecord | None = None  # what this session last wrote
        self._version: str | None = None
        self._text: str | None = None
        self._renewed_at = 0.0  # monotonic start of the last renewal the store took
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # renewals and the pointer's writes: one conditional write at a time
        self.took_over: dict[str, Any] | None = None
        self.pointer_version: str | None = None
        self._pointer_text: str | None = None

    # ------------------------------------------------------------------------------ acquiring
    @property
    def epoch(self) -> int:
        return self.record.epoch if self.record is not None else 0

    def acquire(self, take_over: bool = False) -> LeaseRecord:
        """Take the run's lease, or raise LeaseHeld naming its live holder. An expired or released lease is
        taken without asking; ``take_over`` takes a live one. Either way the epoch grows by one."""
        while True:
            cur = self._read()
            rec = LeaseRecord.from_text(cur.text, self.key) if cur is not None else None
            why = None
            if cur is not None and rec is not None and not rec.released:
                if take_over:
                    why = "--take-over"
                elif rec.ended():  # killed on this machine (a crash, a restarted kernel): no need to wait
                    why = "gone"
                else:
                    why = self._judge(cur, rec)
                    if why is None:
                        continue  # it changed while watched (a release, a takeover): judge the new one
            mine = LeaseRecord(session=self.session, host=socket.gethostname(), pid=os.getpid(),
                               started=_iso(self._started), epoch=(rec.epoch if rec else 0) + 1, ttl_s=self.ttl_s,
                               renewed=_iso(time.time()), machine=this_machine(), proc_start=process_start(os.getpid()),
                               took_over=({"session": rec.session, "host": rec.host, "epoch": rec.epoch, "why": why}
                                          if rec is not None and why else None))
            t0 = self._clock()
            try:
                self._write(mine, cur.version if cur is not None else None)
            except WriteConflict:
                continue  # another session moved it first: read what it wrote and judge that
            self._renewed_at = t0
            self.took_over = mine.took_over
            faults.point("lease.acquired", mine.epoch)
            if why:
                log.warning("took over run %r from %s (epoch %d, %s); that session is fenced: it can no longer "
                            "write to the run", self.run, rec.holder() if rec else "?", mine.epoch - 1, WHY[why])
            log.info("lease on run %r taken: epoch %d, renewed every %.0f s, expires %.0f s after a renewal",
                     self.run, mine.epoch, self.ttl_s / 3, self.ttl_s)
            return mine

    def _judge(self, cur: Versioned, rec: LeaseRecord) -> str | None:
        """Is the lease in ``cur`` expired? Yes: "expired". Live: LeaseHeld. Released or gone while watched: None,
        for the caller to read and judge again."""
        if cur.age is not None:
            if cur.age >= rec.ttl_s:
                return "expired"
            raise LeaseHeld(refusal(self.run, rec, cur.age))
        # No clock of the store's: watch it for one lifetime on this machine's monotonic clock.
        log.info("run %r has a lease (%s); watching it for up to %.0f s to see whether it is renewed", self.run,
                 rec.holder(), rec.ttl_s)
        t0 = self._clock()
        while self._clock() - t0 < rec.ttl_s:
            self._sleep(min(2.0, rec.ttl_s / 6))
            now = self._read()
            if now is None or now.text != cur.text:
                new = LeaseRecord.from_text(now.text, self.key) if now is not None else None
                if new is None or new.released:
                    return None
                raise LeaseHeld(refusal(self.run, new, None))
        return "expired"

    def seal(self, pointer_key: str) -> None:
        """Right after acquiring: learn the pointer's version, which this session's first pointer write names.
        Taken from a holder that may still be alive (expired, or --take-over), the pointer is also rewritten with
        this epoch, on the version read, so that holder's pointer write (conditional on the version it saw) fails
        from now on; a pointer it moved in between is sealed as it now is, and the session resumes from it. A
        released lease, or one whose process has ended, leaves no such writer: the pointer is left as it is."""
        rewrite = self.took_over is not None and self.took_over.get("why") in ("expired", "--take-over")
        while True:
            cur = self._read(pointer_key)
            if cur is None:
                self.pointer_version, self._pointer_text = None, None
                return
            self.pointer_version, self._pointer_text = cur.version, cur.text
            try:
                doc = json.loads(cur.text)
            except json.JSONDecodeError:
                doc = None
            if not rewrite or not isinstance(doc, dict):  # the resume reports a damaged pointer in its own words
                return
            text = json.dumps({**doc, "epoch": self.epoch}, indent=1, sort_keys=True)
            try:
                self.pointer_version = self._write_text(pointer_key, text, cur.version)
            except WriteConflict:
                continue
            self._pointer_text = text
            return

    # ---------------------------------------------------------------------------- renewing
    def start(self) -> None:
        """Renew every third of the lifetime from a daemon thread (never from the training step)."""
        self._thread = threading.Thread(target=self._renewals, name="baton-lease", daemon=True)
        self._thread.start()

    def _renewals(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            if self._lost is not None:
                return
            self.renew()

    def renew(self) -> bool:
        """One renewal; False when this session is fenced (or cannot tell that it is not)."""
        assert self.record is not None
        with self._lock:
            if self._lost is not None:
                return False
            t0 = self._clock()
            if t0 - self._renewed_at >= self.ttl_s:
                self._fence(self._lapsed(t0))
                return False
            new = replace(self.record, renewals=self.record.renewals + 1, renewed=_iso(time.time()))
            try:
                self._write_mine(new)
            except Fenced:
                return False
            except StoreError as e:
                log.warning("could not renew the lease on run %r (%s); retrying in %.0f s (the session stops if no "
                            "renewal reaches the store within %.0f s of the last)", self.run, e, self.ttl_s / 3,
                            self.ttl_s)
                return True
            self._renewed_at = t0
            return True

    def _write_mine(self, new: LeaseRecord) -> None:
        """Replace this session's record with ``new``: on the version last written; a conflict whose current text is
        still ours (a store whose version moves with unrelated writes: the Hub's commits) is retried on the new
        version, any other fences this session."""
        try:
            self._write(new, self._version)
        except WriteConflict:
            cur = self._read()
            if cur is not None and cur.text == self._text:
                self._version = cur.version
                self._write(new, cur.version)
                return
            self._fence(self._taken(cur))
            raise Fenced(self._lost or "") from None

    def _lapsed(self, now: float) -> str:
        return (f"the lease on run {self.run!r} lapsed: no renewal reached the store for {now - self._renewed_at:.0f} s "
                f"(its lifetime is {self.ttl_s:.0f} s; the process was paused or the store unreachable), so another "
                "session may hold the run now: this session is fenced and stopped without writing anything more")

    def _taken(self, cur: Versioned | None) -> str:
        try:
            rec = LeaseRecord.from_text(cur.text, self.key) if cur is not None else None
        except StoreError:
            rec = None
        by = f"{rec.holder()} (epoch {rec.epoch})" if rec is not None else "another session"
        return (f"this session's lease on run {self.run!r} (epoch {self.epoch}) was taken over by {by}: this session "
                "is fenced and stopped without writing anything more (the run goes on in that session)")

    def _fence(self, why: str) -> None:
        if self._lost is None:
            self._lost = why
            log.error("%s", why)

    # ----------------------------------------------------------------------------- fencing
    @property
    def lost(self) -> str | None:
        """Why this session is fenced, or None while it holds the run."""
        if self._lost is None and self.record is not None and not self.record.released:
            now = self._clock()
            if now - self._renewed_at >= self.ttl_s:
                self._fence(self._lapsed(now))
        return self._lost

    def explain(self) -> str | None:
        """Why this session is fenced, for its last words: a lapsed lease that another session has taken since is
        said to be taken over, naming that session (one read of the lease, never a write)."""
        why = self.lost
        if why is None or "lapsed" not in why:
            return why
        try:
            cur = self._read()
            rec = LeaseRecord.from_text(cur.text, self.key) if cur is not None else None
        except StoreError:
            return why
        if rec is None or (rec.session == self.session and rec.epoch == self.epoch):
            return why
        return f"{self._taken(cur)}; its own lease had lapsed first ({why.split(': ', 1)[1].split(', so')[0]})"

    def check(self) -> None:
        """Before a write (no request): raise Fenced once this session is fenced or its lease has lapsed."""
        why = self.lost
        if why is not None:
            raise Fenced(why)

    def _mine(self, cur: Versioned) -> bool:
        """Whether ``cur`` (the lease as just read) is this session's hold: what it last wrote, or a renewal of it
        that landed while this thread read."""
        if cur.text == self._text:
            return True
        try:
            rec = LeaseRecord.from_text(cur.text, self.key)
        except StoreError:
            return False
        return rec.session == self.session and rec.epoch == self.epoch and not rec.released

    def verify(self) -> None:
        """Before an irreversible write (pruning): read the lease (one request) and raise Fenced unless it is
        still this session's."""
        self.check()
        cur = self._read()
        if cur is None or not self._mine(cur):
            self._fence(self._taken(cur))
            raise Fenced(self._lost or "")

    def on_moved(self) -> str:
        """For a store that fences its own commits (``HubStore.fence``): someone else committed since this
        session's last commit. Raises Fenced unless the lease is still this session's; returns the version (the
        commit) at which it read that it is."""
        cur = self._read()
        if cur is None or not self._mine(cur):
            self._fence(self._taken(cur))
            raise Fenced(self._lost or "")
        self.check()
        return cur.version

    def roll(self, key: str, text: str) -> None:
        """The pointer's write: only on the version this session last saw (sealed at acquiring, then each of its
        own writes). A version moved by unrelated writes (the Hub) with the pointer's text unchanged is retried;
        a pointer someone else moved fences this session or, if it still holds the lease, fails the write."""
        with self._lock:
            self.check()
            try:
                self.pointer_version = self._write_text(key, text, self.pointer_version)
            except WriteConflict:
                cur = self._read(key)
                if cur is not None and self._pointer_text is not None and cur.text == self._pointer_text:
                    self.pointer_version = self._write_text(key, text, cur.version)
                else:
                    self.verify()  # raises Fenced when the lease is gone
                    raise WriteConflict(f"the pointer {key} in {self.store.describe()} was moved by another writer "
                                        f"although this session holds the run (epoch {self.epoch}); it was not "
                                        "overwritten: rerun to resume from it") from None
            self._pointer_text = text

    # ---------------------------------------------------------------------------- releasing
    def release(self) -> None:
        """At a clean end (also a signal's stop and a SLURM requeue): mark the lease released so the next session
        takes it at once. Refused (fenced) or failing, it only logs: the lease then expires."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            if self.record is None or self.record.released or self._lost is not None:
                return
            try:
                self._write_mine(replace(self.record, released=True, renewed=_iso(time.time())))
                log.info("lease on run %r released (epoch %d)", self.run, self.epoch)
            except StoreError as e:
                log.warning("could not release the lease on run %r (%s); it expires %.0f s after its last renewal",
                            self.run, e, self.ttl_s)

    # ------------------------------------------------------------------------------ helpers
    def _read(self, key: str | None = None) -> Versioned | None:
        return self.store.read_versioned(key or self.key)

    def _write_text(self, key: str, text: str, version: str | None) -> str:
        return self.store.write_if(key, text, version)

    def _write(self, rec: LeaseRecord, version: str | None) -> None:
        text = rec.to_text()
        self._version = self._write_text(self.key, text, version)
        self._text, self.record = text, rec
        faults.point("lease.written", rec.epoch)


def read_lease(store: Store, run: str) -> tuple[LeaseRecord, float | None] | None:
    """The run's lease and its age by the store's clock (None where the store tells none); None: no lease."""
    cur = store.read_versioned(lease_key(run))
    if cur is None:
        return None
    return LeaseRecord.from_text(cur.text, lease_key(run)), cur.age


class FencedStore:
    """The session's store: reads pass through; every write first asks the lease (no request) and is refused
    once the session is fenced, so nothing a fenced session does afterwards reaches the run. The pointer goes
    through ``roll`` (conditional on its last version) and pruning through ``verify_lease`` (one read)."""

    def __init__(self, store: Store, lease: Lease):
        self.inner = store
        self.lease = lease
        self.hashes_on_write = getattr(store, "hashes_on_write", False)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in ("put_files", "delete_many"):
            def fenced(*args: Any, **kwargs: Any) -> Any:
                self.lease.check()
                return attr(*args, **kwargs)
            return fenced
        return attr

    def describe(self) -> str:
        return self.inner.describe()

    def put_file(self, local: Path, key: str, sha256: Any, create: bool = False) -> str:
        self.lease.check()
        return self.inner.put_file(local, key, sha256, create=create)

    def list(self, prefix: str, checksums: bool = True) -> Any:
        return self.inner.list(prefix, checksums)

    def read_range(self, key: str, start: int, end: int) -> Any:
        return self.inner.read_range(key, start, end)

    def get_file(self, key: str, local: Path) -> None:
        self.inner.get_file(key, local)

    def delete(self, key: str) -> None:
        self.lease.check()
        self.inner.delete(key)

    def read_text(self, key: str) -> str | None:
        return self.inner.read_text(key)

    def write_text(self, key: str, text: str) -> None:
        self.lease.check()
        self.inner.write_text(key, text)

    def read_versioned(self, key: str) -> Versioned | None:
        return self.inner.read_versioned(key)

    def write_if(self, key: str, text: str, version: str | None) -> str:
        self.lease.check()
        return self.inner.write_if(key, text, version)

    def roll(self, key: str, text: str) -> None:
        self.lease.roll(key, text)

    def verify_lease(self) -> None:
        self.lease.verify()
