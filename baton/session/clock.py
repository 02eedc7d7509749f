"""The session's clock: when to stop so the last checkpoint still lands, and when a timed checkpoint is due.

At each step boundary the session asks: if I run one more step, is there still time for the final
checkpoint cycle and the margin before the deadline? The step time is the slowest of the recent steps
and the cycle time the slowest one measured (this session, or earlier sessions in the ledger), so the
estimate errs towards stopping early. Before any cycle is measured, ``ckpt_guess_s`` stands in.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import deque
from datetime import datetime, timezone
from typing import Any

from ..config import Config
from ..errors import BatonError
from ..planning.plan import HOUR, parse_hours, parse_instant

log = logging.getLogger(__name__)

RECENT_STEPS = 10


def guess_checkpoint_seconds(n_params: int) -> float:
    """A deliberately slow guess for a first cycle: 12 bytes/parameter (weights + Adam) at 20 MB/s, +2 s."""
    return 2.0 + 12 * n_params / 20e6


class TimeBudget:
    def __init__(self, deadline: float | None, margin_s: float, ckpt_guess_s: float, ckpt_every_s: float = 0.0,
                 start: float | None = None, eval_steps: float = 0.0):
        self.deadline = deadline
        self.eval_steps = eval_steps  # the final evaluation, in training steps (forward only: about a third each)
        self.margin_s = margin_s
        self.ckpt_guess_s = ckpt_guess_s
        self.ckpt_every_s = ckpt_every_s
        self.steps: deque[float] = deque(maxlen=RECENT_STEPS)
        self.ckpt_max: float | None = None
        self.last_ckpt = time.time() if start is None else start
        self.stepping_seconds = 0.0
        self.eval_max: float | None = None  # the slowest periodic evaluation measured in this session

    def observe_eval(self, seconds: float) -> None:
        self.eval_max = seconds if self.eval_max is None else max(self.eval_max, seconds)

    def observe_step(self, seconds: float) -> None:
        self.steps.append(seconds)
        self.stepping_seconds += seconds

    def observe_checkpoint(self, seconds: float, at: float | None = None) -> None:
        self.ckpt_max = seconds if self.ckpt_max is None else max(self.ckpt_max, seconds)
        self.last_ckpt = time.time() if at is None else at

    @property
    def step_estimate(self) -> float:
        return max(self.steps) if self.steps else 0.0

    @property
    def ckpt_estimate(self) -> float:
        return self.ckpt_max if self.ckpt_max is not None else self.ckpt_guess_s

    @property
    def eval_estimate(self) -> float:
        """One evaluation of the held-out windows: as measured, or guessed from the step time."""
        guess = self.step_estimate * self.eval_steps
        return guess if self.eval_max is None else max(guess, self.eval_max)

    def needed(self, final: bool, evaluates: bool = False) -> float:
        """Seconds one more step and the end of the session take; ``final``: that step reaches the horizon,
        where the evaluation runs and the exported model is pushed too (one more cycle); ``evaluates``: a
        periodic evaluation follows that step."""
        finish = self.ckpt_estimate + self.eval_estimate if final else 0.0
        periodic = self.eval_estimate if evaluates else 0.0
        return self.step_estimate + periodic + self.ckpt_estimate + finish + self.margin_s

    def should_stop(self, now: float, final: bool = False, in_flight: bool = False, evaluates: bool = False) -> bool:
        """``in_flight``: a background push is still running; the session waits for it before its last one."""
        if self.deadline is None:
            return False
        return now + self.needed(final, evaluates) + (self.ckpt_estimate if in_flight else 0.0) > self.deadline

    def checkpoint_due(self, now: float) -> bool:
        return self.ckpt_every_s > 0 and now - self.last_ckpt >= self.ckpt_every_s

    def seconds_left(self, now: float) -> float | None:
        return None if self.deadline is None else self.deadline - now


def process_start_time() -> float:
    """When this process started (epoch seconds), from /proc on Linux; now elsewhere.

    The platform's clock started before Python did: importing torch alone takes seconds, and they count.
    """
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime, in clock ticks after boot
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return min(time.time(), btime + ticks / os.sysconf("SC_CLK_TCK"))  # btime is whole seconds: errs early
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def session_clock(cfg: Config, session_start: float | None, session_hours: float | str | None,
                  deadline: str | None) -> tuple[float, float | None]:
    """(start, deadline) of a `baton train`, in epoch seconds. The budget counts from ``session_start``, else
    from this process's start (the platform's clock); the earlier of the two limits wins."""
    started = session_start if session_start is not None else process_start_time()
    deadlines = []
    if session_hours is not None:  # given: 0 is a budget of nothing, not "no budget" (that is leaving it out)
        hours = parse_hours(session_hours, "--session-hours")
        if hours <= 0:
            raise BatonError(f"--session-hours must be > 0, got {session_hours!r} (leave it out for no time budget)")
    else:
        hours = cfg.budget.session_hours  # 0 in the config: no budget
    if hours:
        deadlines.append(started + hours * HOUR)
    elif session_start is None:  # a launched rank has the launcher's deadline already
        end = slurm_end_time()
        if end is not None:
            deadlines.append(end)
    if deadline:
        deadlines.append(parse_instant(deadline, "--deadline").timestamp())
    stop_at = min(deadlines) if deadlines else None
    margin = cfg.budget.margin_minutes * 60
    if stop_at is not None and session_start is None and stop_at - time.time() <= margin:
        # Checked where the user starts the session (a launched rank has the launcher's clock, already
        # checked): a budget that ends before the margin does cannot train a step, and a session that bills
        # only to stop at once is a mistake in the time (often its zone), not a plan.
        when = datetime.fromtimestamp(stop_at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        raise BatonError(
            f"the time budget ends {when}, {'already past' if stop_at <= time.time() else 'too soon'}: nothing can "
            f"train before the {margin / 60:g} min margin (budget.margin_minutes); give a later --deadline "
            "(ISO 8601 with its zone, e.g. 2026-09-26T18:00+02:00) or a longer --session-hours "
            "(budget.session_hours)")
    return started, stop_at


def slurm_end_time() -> float | None:
    """When the SLURM job this process runs in ends (None outside SLURM, or for a job without a time limit)."""
    from ..runtime.slurm import current_job

    job = current_job()
    if job is None:
        return None
    if job.end_ts is None:
        log.info("SLURM job %s: no end time known (no time limit): no time budget from it", job.job_id)
        return None
    log.info("time budget: SLURM job %s ends %s (set --session-hours or budget.session_hours to stop sooner)",
             job.job_id, datetime.fromtimestamp(job.end_ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return job.end_ts


# A repeat of the stop signal this soon after the first is the same request delivered twice (to the process
# group by the platform and once more by a launcher that forwards it).
DUPLICATE_SIGNAL_S = 2.0
# SIGHUP too: a launcher passes a closed terminal's hang-up on (but a SIGHUP that nohup ignores stays ignored).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)


def _once_more(signum: int, frame: Any, old: Any) -> None:
    """A second stop signal: what the process would have done without baton's handler, now. A Python handler
    (Python's own for SIGINT, which raises KeyboardInterrupt; a notebook kernel's) is called, so a notebook's second
    interrupt ends the cell, not the kernel; otherwise the default action ends the process at once."""
    if callable(old):
        signal.signal(signum, old)
        old(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


class StopSignals:
    """SIGTERM, SIGINT, SIGUSR1 (and SIGHUP, and SLURM's warning signal) set a flag the loop reads at each step boundary; a second
    signal (after the duplicate window) restores the default action and re-raises it: the process ends at
    once."""

    def __init__(self, extra: tuple[int, ...] = ()) -> None:
        self.signals = (*STOP_SIGNALS, *(s for s in extra if s not in STOP_SIGNALS))  # extra: train.slurm_signal
        self.signum: int | None = None
        self.at = 0.0
        self._old: dict[int, Any] = {}

    def _handler(self, signum, frame) -> None:
        now = time.monotonic()
        if self.signum is not None:
            if now - self.at < DUPLICATE_SIGNAL_S:
                return
            _once_more(signum, frame, self._old.get(signum))
            return
        self.signum, self.at = signum, now
        log.warning("received %s: will checkpoint at the next step boundary and exit 0 (a second signal exits at "
                    "once)", signal.Signals(signum).name)

    def install(self) -> None:
        try:
            for s in self.signals:
                if s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN:
                    continue
                self._old[s] = signal.signal(s, self._handler)
        except ValueError:  # not the main thread (embedded use): no signal handling
            self.restore()
            return
        held = HeldSignals.current
        if held is not None and held.signum is not None and self.signum is None:
            # It came while the process was still starting (its imports): the session stops at its first boundary.
            self.signum, self.at, held.signum = held.signum, held.at, None
            log.warning("received %s while starting: will stop at the first step boundary and exit 0",
                        signal.Signals(self.signum).name)

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}


class HeldSignals:
    """Around a session in a process of its own (``baton train``): the stop signals that arrive while no session
    listens, during the imports and set-up before it and the booking and printing after it. One before is handed
    to the session (it stops at its first boundary); one after finds the work done and is only noted. Without this,
    either ended the process at once with status 143. A repeat after the duplicate window exits at once, as in a
    session. The handlers the process had come back on exit (``with HeldSignals():``)."""

    current: HeldSignals | None = None

    def __init__(self) -> None:
        self.signum: int | None = None
        self.at = 0.0
        self._old: dict[int, Any] = {}

    def _handler(self, signum, frame) -> None:
        now = time.monotonic()
        if self.signum is not None and now - self.at >= DUPLICATE_SIGNAL_S:
            _once_more(signum, frame, self._old.get(signum))
            return
        if self.signum is None:
            self.signum, self.at = signum, now
            log.info("received %s outside a training session: noted", signal.Signals(signum).name)

    def __enter__(self) -> HeldSignals:
        try:
            for s in STOP_SIGNALS:
                if s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN:
                    continue
                self._old[s] = signal.signal(s, self._handler)
        except ValueError:  # not the main thread: nothing held
            return self
        HeldSignals.current = self
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}
        HeldSignals.current = None
