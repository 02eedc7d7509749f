"""One training session: the parts the loop calls, built before it and torn down after it.

A session resumes from the store on its own, trains to a stop boundary, and hands on the baton through
the verified checkpoint cycle. Every rank runs the same code; only rank 0 talks to the store, and every
decision that ends the session (stop step, signal, failed push) is agreed by all ranks.

What a session holds, by how it changes: ``parts`` (built once, frozen), ``state`` (the loop's position and
counters), ``checkpointer`` (the push in flight and the lineage), ``budget`` (the clock).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import signal
import struct
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from ..checkpoint.history import newest_validation
from ..checkpoint.record import Shortened
from ..config import Config
from ..data.reader import micro_batches
from ..errors import BatonError, Fenced
from ..guard import without_credentials
from ..model.llama import build_model
from ..model.optimizer import build_optimizer
from ..planning.ledger import checkpoint_seconds, read_ledger
from ..runtime import attention, cuda, dist
from ..runtime.memory import rss_peak
from ..runtime.slurm import warning_signal
from ..tracking import Trackers, check_installed, open_trackers
from ..tracking.trackers import read_rows
from . import anytime, readahead
from . import parts as session_parts
from . import resume as resuming
from .checkpointer import Checkpointer
from .clock import StopSignals, TimeBudget, guess_checkpoint_seconds
from .spikes import detector
from .state import TrainState

log = logging.getLogger(__name__)


class StepValues(NamedTuple):
    """What a step reads back from the device, once (``Session.reduce_step``)."""

    loss: float  # the mean loss of the global batch
    grad_norm: float  # before clipping, over every rank's gradients
    overflow: bool  # the GradScaler found an inf or NaN gradient (fp16); False without a scaler
    batch_sha: str  # the digest of the global batch's samples


@dataclass(frozen=True)
class Boundary:
    """What every rank agreed at a step boundary (one all-reduce); the loop acts on each field in turn.

    Agreeing does no store work: rank 0 only reads its own state. What follows from it (booking a push, a
    heartbeat) is a named step of the loop, so no rank waits in the step's collective while rank 0 talks to
    the store."""

    push_failed: bool  # rank 0's background push failed: every rank stops with its error
    push_done: bool  # rank 0's background push is verified: the loop books it (``Checkpointer.book``)
    signal: bool  # a stop signal reached some rank
    out_of_time: bool  # rank 0's clock: one more step would not leave time for the final checkpoint
    checkpoint_due: bool  # the timed checkpoint cadence (budget.ckpt_minutes)
    heartbeat_due: bool  # the ledger's heartbeat (budget.heartbeat_minutes)
    fenced: bool = False  # rank 0 lost the run's lease (taken over, or lapsed): every rank stops at once


class Session:
    def __init__(self, cfg: Config, resume: str = "auto", stop_after: int | None = None, progress: bool = True,
                 deadline: float | None = None, started: float | None = None,
                 allow_change: tuple[str, ...] = (), take_over: bool = False):
        # The session's clock starts when `baton train` started (``started``), not here: the platform's does.
        self.t_start = started if started is not None else time.time()
        self.deadline = deadline
        self.progress_enabled = progress
        self._ledger_open = True
        self.allow_change = frozenset(allow_change)  # keys a resume may change on purpose (session.drift)
        # From the start, not after the resume: a preemption signal while the data and the checkpoint are
        # pulled (minutes, for a large run) would otherwise kill the process at once, with no ledger end and
        # a nonzero exit. With the flag set, the session stops at its first boundary and exits 0.
        self._signals = StopSignals((warning_signal(cfg.train.slurm_signal),))
        self._signals.install()
        try:
            self._setup(cfg, resume, stop_after, deadline, take_over)
        except BaseException as e:
            self._signals.restore()  # a failed start leaves the caller's handlers (a notebook's interrupt) be
            attention.ORDER.leave()
            parts = getattr(self, "parts", None)
            if parts is not None:
                # Billed from its start to here, whatever failed (a resume's own failure has ended it already).
                self.end_ledger(without_credentials(f"failed: {type(e).__name__}: {e}"))
                if parts.lease is not None:
                    parts.lease.release()  # the next session may start at once
            raise

    def _setup(self, cfg: Config, resume: str, stop_after: int | None, deadline: float | None,
               take_over: bool) -> None:
        check_installed(cfg.log.backends)  # a missing tracker package fails now, not after the first hour
        p = session_parts.build(cfg, stop_after, self.t_start, deadline, resume, self.allow_change, take_over)
        self.parts = p
        try:
            resumed = resuming.resume(p, resume, self.allow_change)
        except BaseException as e:
            self.end_ledger(f"failed: {type(e).__name__}: {e}")
            raise
        self.state = TrainState(step=resumed.step, stats=resumed.stats, resumed_from=resumed.from_step,
                                session_from=resumed.from_step,
                                spikes=detector(cfg.train, resumed.stats.spike_window))
        self.metrics_path = p.run_dir / "metrics.jsonl"
        # The run's newest validation so far (the resumed checkpoint's metrics.jsonl holds it): what the summary
        # says when this session runs none of its own.
        self.state.val = newest_validation(read_rows(self.metrics_path)) if resumed.from_step else None
        self.complete_pointer = resumed.complete  # the run is already complete: nothing to train
        if p.compile_cache is not None and p.startup is not None and resumed.complete is None:
            p.startup.pull += p.compile_cache.load()  # before anything compiles; the wait beyond the other pulls
        if resumed.total_steps is not None and resumed.total_steps != p.total_steps:
            p = self.parts = with_horizon(p, resumed.total_steps)  # anytime mode's shorter horizon
        self.state.shortened = resumed.shortened
        self.anytime = anytime.start_watch(resumed.shortened)  # anytime mode's last answer (session.anytime)
        self.budget = self._time_budget()
        if p.ledger is not None:
            p.ledger.resumed(self.state.step)
        # Wrapped after resuming: the checkpoint is the full state, loaded into the plain model first.
        self.parts = p = p.wrapped()
        self.trackers: Trackers | None = None  # rank 0's: metrics.jsonl, TensorBoard, W&B, MLflow ([log])
        if p.dist.is_main:
            try:  # opened after resuming rewrote metrics.jsonl
                self.trackers = open_trackers(cfg, p.store, self.state.step, self.metrics_path)
            except BaseException as e:
                self.end_ledger(f"failed: {type(e).__name__}: {e}")
                raise
        self.checkpointer = Checkpointer(p, self.state, self.budget, resumed.parent, self.metrics_path, self.trackers,
                                         no_pointer=resumed.no_pointer)
        # Each step's sample digests, summed over ranks in reduce_step's collective; pinned where the sum runs
        # on a GPU. Rewritten only after the step's read, when its copy to the device is done.
        self._batch_rows = torch.zeros(cfg.train.global_batch, dtype=torch.float64,
                                       pin_memory=p.device.type == "cuda" and p.world > 1)
        self._rows = np.zeros((0, 1), dtype=np.int64)  # the host rows of the step being computed
        self._digests: list[int] | None = None  # their digests, where they were made with the rows
        self._batch_sha: str | None = None  # and the global batch's, where this rank's share is all of it
        self._ahead = readahead.ShareAhead(cfg.train.global_batch, p.dist.rank, p.world, cfg.data.seq_len) \
            if p.device.type == "cpu" else None
        self._bar = None

    # -------------------------------------------------------------------------------- the step
    def autocast(self):
        if self.parts.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.parts.device.type, dtype=self.parts.autocast_dtype)

    def no_sync(self, last_micro: bool):
        # Gradients are reduced across ranks once per optimizer step, on the last micro-batch only.
        return self.parts.parallel.grad_sync(self.parts.model, enabled=last_micro)

    def micro_batches(self, step: int):
        """This rank's micro-batches of global batch ``step`` (``data.reader``: ``rank_rows`` sliced by
        ``micro_batches``, the path the reader's tests check). The samples' digests are made later, in
        ``reduce_step``, once the step's work is queued on the device."""
        p = self.parts
        # Host work between the model's kernels is what a step pays for beyond a bare loop: on the CPU the
        # shares of the next steps are read, split and digested at once (baton.session.readahead) ...
        share = self._ahead.share(p.data, step) if self._ahead is not None else None
        if share is not None:
            self._digests, self._batch_sha = share.digests, share.batch_sha
            return readahead.micro_batches(share, p.micro_batch)
        # ... elsewhere the rank's whole share of this step at once: one read, one pinned asynchronous copy to
        # the GPU; the micro-batches are slices of it, and its digests are made once its kernels are queued.
        t = p.data.rank_rows(step, p.cfg.train.global_batch, p.dist.rank, p.world)
        self._rows, self._digests, self._batch_sha = t.numpy(), None, None
        if p.device.type == "cuda":
            t = t.pin_memory().to(p.device, non_blocking=True)
        return micro_batches(t, p.micro_batch)

    def reduce_step(self, losses: list[torch.Tensor], grad_norm: torch.Tensor, found_inf: torch.Tensor | None = None
                    ) -> StepValues:
        """The step's one read from the device: the loss (summed over this rank's micro-batches, then its mean
        over ranks), the gradient norm, the GradScaler's overflow flag and the digest of the whole global
        batch, in one collective and one copy to the host.

        The micro-batches' losses are summed in fp32 in their order, from zero, as a running sum on the device
        would: on one rank after the read, on the host (fp32 additions are the same everywhere), which saves
        the device a kernel per micro-batch; with several ranks on the device, before the collective.

        The digest is a hash of every sample in global-batch order, whatever the number of ranks, so two
        runs that read the same samples in the same steps show the same ``batch_sha`` in metrics.jsonl. It is
        made here, after the step's forward and backward are queued: on a GPU the host hashes while the device
        computes, instead of before the first kernel.
        """
        p = self.parts
        mine = self._digests if self._digests is not None else readahead.row_digests(self._rows)
        local = [grad_norm] if found_inf is None else [grad_norm, found_inf]
        k = len(local)
        with torch.no_grad():
            if p.world == 1:  # nothing to reduce
                host = torch.stack([*local, *losses]).cpu().numpy()  # the read
                loss, rows = f32_running_sum(host[k:].tolist()) / p.accum, mine
            else:
                digests = self._batch_rows.numpy()  # pinned on CUDA: its copy below does not wait for the device
                digests[:] = 0.0
                pos = p.dist.rank * (p.cfg.train.global_batch // p.world)  # this rank's share in the global batch
                digests[pos:pos + len(mine)] = mine
                total = losses[0]
                for t in losses[1:]:
                    total = total + t
                shared = torch.cat([(total.double() / p.accum).view(1),
                                    self._batch_rows.to(p.device, non_blocking=True)])
                dist.sum_(shared)
                host = torch.cat([torch.stack(local).double(), shared]).cpu().numpy()  # the read
                loss, rows = float(host[k]) / p.world, host[k + 1:].astype(np.int64).tolist()
        sha = self._batch_sha if p.world == 1 and self._batch_sha is not None else readahead.batch_digest(rows)
        return StepValues(loss, float(host[0]), bool(host[1]) if found_inf is not None else False, sha)

    # ------------------------------------------------------------------------- step boundaries
    def agree(self, step: int) -> Boundary:
        """The one collective per step boundary: each rank's view, maxed over ranks (see ``Boundary``).

        A signal on any rank stops every rank. The clock is rank 0's alone (its ledger knows the measured
        checkpoint times), so the ranks cannot disagree about the deadline. A push that finished is taken here
        (in memory: its cost reaches the clock before it decides) and booked by the loop after.
        """
        p, now = self.parts, time.time()
        flags = [False, False, self._signals.signum is not None, False, False, False, False]
        if p.dist.is_main:
            ckpt = self.checkpointer
            flags[0] = ckpt.finished() and ckpt.pusher.failure() is not None
            if ckpt.finished() and not flags[0]:
                ckpt.take()
            flags[1] = bool(ckpt.unbooked)
            flags[3] = self.budget.should_stop(now, final=step + 1 >= p.total_steps, in_flight=ckpt.pusher.in_flight,
                                               evaluates=self.eval_due(step + 1))
            # Not while a push is in flight: the cadence runs from when that checkpoint began (taken, it moves the
            # clock's mark), and one more now would only wait for it, step after step.
            flags[4] = self.budget.checkpoint_due(now) and ckpt.pending is None
            flags[5] = p.ledger is not None and self._ledger_open and p.ledger.heartbeat_due(now)
            flags[6] = p.lease is not None and p.lease.lost is not None
        if p.world > 1:
            import torch.distributed as tdist

            t = torch.tensor([float(f) for f in flags], device=p.device)
            tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
            flags = [bool(v) for v in t.tolist()]
        return Boundary(*flags)

    def heartbeat(self, step: int) -> None:
        """All ranks: rank 0 rewrites its ledger record (a failed write warns); the others wait for it."""
        ledger = self.parts.ledger
        dist.on_main(lambda: ledger.heartbeat(step, self.budget.stepping_seconds) if ledger is not None else None)

    def reload(self, base: int) -> None:
        """All ranks: the model, optimizer, scaler, RNG, counters and cursor from the store's pointer at ``base``,
        as a session starting now would load them (``resume`` in mode auto, whatever this session started from),
        wrapped for the ranks again. The trackers and the checkpointer follow (a loss-spike rollback)."""
        p, st = self.parts, self.state
        cfg = p.cfg
        if self.trackers is not None:  # the resume rewrites metrics.jsonl from the checkpoint's copy
            self.trackers.rewind(base)
        model = build_model(cfg.model, p.device, seed=cfg.train.seed)
        plain = dataclasses.replace(p, model=model, optimizer=build_optimizer(model, cfg, p.device),
                                    scaler=torch.amp.GradScaler(p.device.type, enabled=cfg.train.precision == "fp16"))
        r = resuming.resume(plain, "auto", self.allow_change)
        st.step, st.stats, st.resumed_from = r.step, r.stats, r.from_step
        # The newest validation is the one of the rewound history (a later one scored a model gone back from).
        st.val = newest_validation(read_rows(self.metrics_path)) if r.from_step else None
        st.spikes = detector(cfg.train, st.stats.spike_window)
        if r.shortened is not None or st.shortened is None:  # else: shortened here since, at the step gone back to
            st.shortened = r.shortened
            plain = with_horizon(plain, r.total_steps or cfg.total_steps)
        self.parts = plain.wrapped()
        self.checkpointer.rebase(self.parts, r.parent)
        if self._bar is not None:
            self._bar.n = st.step
            self._bar.refresh()

    def rolled_back(self, rollbacks: list[dict[str, Any]], skipped: tuple[tuple[int, int], ...],
                    row: dict[str, Any]) -> None:
        """After ``reload``: the rollbacks so far and the stream ranges skipped from now on, which every later
        checkpoint carries; the rollback's own row in metrics.jsonl (rank 0)."""
        self.state.stats.rollbacks = rollbacks
        self.parts.data.set_skipped(skipped)
        self.state.spikes = detector(self.parts.cfg.train, self.state.stats.spike_window)
        if self.parts.dist.is_main:
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    def set_horizon(self, total_steps: int, shortened: Shortened | None) -> None:
        """All ranks: train to ``total_steps`` from here (anytime mode's decision); every later checkpoint keeps
        ``shortened``, the record of it."""
        self.parts = with_horizon(self.parts, total_steps)
        self.checkpointer.parts = self.parts
        self.state.shortened = shortened
        if self._bar is not None:
            self._bar.total = self.parts.stop_step
            self._bar.refresh()

    def fenced(self) -> Fenced:
        """The error every rank stops with once rank 0's lease is lost: rank 0's reason (others learn it there)."""
        lease = self.parts.lease
        why = lease.explain() if lease is not None else None
        return Fenced(why or "rank 0 lost the run's lease to another session: this session is fenced and stopped without writing "
                             "anything more")

    def stop_reason(self, b: Boundary) -> str:
        if not b.signal:
            return "time budget"
        signum = self._signals.signum
        return signal.Signals(signum).name if signum else "signal"  # another rank's signal: named there

    # ------------------------------------------------------------------------ time and ledger
    def _time_budget(self) -> TimeBudget:
        p, b = self.parts, self.parts.cfg.budget
        guess, source = b.ckpt_seconds, "configured"
        if not guess and p.dist.is_main and self.deadline is not None:
            try:
                guess, source = checkpoint_seconds(read_ledger(p.store, p.run)[0]) or 0.0, "earlier sessions"
            except BatonError as e:
                log.warning("could not read the ledger for earlier checkpoint times (%s)", e)
        if not guess:
            guess, source = guess_checkpoint_seconds(p.n_params), "a guess from the model size"
        eval_steps = p.cfg.data.val_windows / p.cfg.train.global_batch / 3
        minutes = self._cadence_minutes(guess, source) if b.ckpt_minutes == "auto" else float(b.ckpt_minutes)
        budget = TimeBudget(self.deadline, b.margin_minutes * 60, guess, minutes * 60, eval_steps=eval_steps)
        if self.deadline is not None and p.dist.is_main:
            log.info("time budget: stop by %s, keeping %.1f s for the final checkpoint (%s, until measured) and "
                     "%.0f s margin", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.deadline)),
                     budget.ckpt_estimate, source, budget.margin_s)
        return budget

    def _cadence_minutes(self, ckpt_seconds: float, source: str) -> float:
        """budget.ckpt_minutes = "auto": chosen on rank 0 (whose clock alone decides a timed checkpoint) from the
        ledger's interruptions and the checkpoint cycle (``planning.cadence``)."""
        p = self.parts
        if not p.dist.is_main:
            return 0.0
        from ..planning.cadence import resolve_cadence

        try:
            records = read_ledger(p.store, p.run)[0]
        except BatonError as e:
            log.warning("could not read the ledger for the interruption rate (%s)", e)
            records = []
        hours = (self.deadline - self.t_start) / 3600 if self.deadline is not None else 0.0
        cadence = resolve_cadence("auto", records, ckpt_seconds, hours, hours, source)
        log.info("checkpoint cadence: %s", cadence.reason)
        return cadence.minutes

    def end_ledger(self, outcome: str, requeued: bool = False) -> None:
        ledger = self.parts.ledger
        if ledger is not None and self._ledger_open:
            self._ledger_open = False
            budget = getattr(self, "budget", None)
            state = getattr(self, "state", None)
            ledger.end(outcome, state.step if state else None, budget.stepping_seconds if budget else 0.0,
                       requeued)

    # ---------------------------------------------------------------------------- bookkeeping
    def stepping_begins(self) -> None:
        """The loop is about to take its first step: the start-up ends here."""
        if self.parts.startup is not None:
            self.parts.startup.stepping_begins()

    def _startup_step(self, seconds: float) -> None:
        """The first two steps' seconds: the start-up's split for the ledger; after the first, the compile cache's
        push (rank 0, when it compiled cold)."""
        p = self.parts
        clock, cache = p.startup, p.compile_cache
        if clock is None or not clock.observe(seconds):
            return
        if cache is not None and clock.second is None:
            cache.after_first_step(p.store, p.micro_loss, p.ledger.id if p.ledger is not None else None)
        self._book_startup()

    def _book_startup(self) -> None:
        p = self.parts
        if p.ledger is None or p.startup is None:
            return
        cache = p.compile_cache
        split = p.startup.split(cache.kind if cache is not None else "off", cache.said() if cache is not None else None)
        if split is not None:
            p.ledger.started_stepping(split)

    def startup_summary(self) -> dict[str, Any] | None:
        p = self.parts
        cache = p.compile_cache
        split = p.startup.split(cache.kind if cache else "off", cache.said() if cache else None) if p.startup else None
        return dataclasses.asdict(split) if split is not None else None

    def record(self, step: int, m: dict[str, Any]) -> None:
        p, st = self.parts, self.state
        st.step = step
        self._startup_step(m["step_seconds"])
        self.budget.observe_step(m["step_seconds"])
        st.stats.last_loss = m["loss"]
        if step % p.cfg.train.log_every == 0 or step >= p.stop_step:
            self.note_peak()
        if not p.dist.is_main:
            return
        row = {"step": step, **m, "samples_consumed": step * p.cfg.train.global_batch}
        u = p.flops.mfu(m["tokens_per_s"])
        if u is not None:
            row["mfu"] = round(u, 4)
        assert self.trackers is not None  # rank 0 opened them
        self.trackers.log(step, row)  # a tracker that fails is dropped with a warning (tracking.Trackers)
        if "val_loss" in m:
            log.info("step %d validation: loss %.4f ppl %.2f over %d windows (%.1f s)", step, m["val_loss"],
                     m["val_ppl"], m["val_windows"], m["eval_seconds"])
        if self._bar is not None:
            self._bar.update(1)
            if step % p.cfg.train.log_every == 0 or step == p.stop_step or "val_loss" in m:
                val = st.val.get("val_loss") if st.val else None
                self._bar.set_postfix(loss=f"{m['loss']:.4f}", lr=f"{m['lr']:.2e}", tok_s=f"{m['tokens_per_s']:.0f}",
                                      **({"mfu": f"{u:.1%}"} if u is not None else {}),
                                      **({"val": f"{val:.4f}"} if val is not None else {}))
        if step % p.cfg.train.log_every == 0:
            log.debug("step %d loss %.4f lr %.3e gnorm %.3f tok/s %.0f", step, m["loss"], m["lr"], m["grad_norm"],
                      m["tokens_per_s"])

    def note_peak(self) -> None:
        """Take the device's memory high-water mark into the training peak. The mark is kept by the allocator (or
        the kernel, for the host's RSS) over every step, so reading it at the log cadence, before an evaluation
        and when stepping ends misses nothing; a read per step would cost host time (CUDA's builds its whole
        statistics dictionary)."""
        p, st = self.parts, self.state
        if p.device.type == "cuda":
            st.peak_train = max(st.peak_train, cuda.peak_allocated(p.device))
        else:
            st.peak_train = max(st.peak_train, rss_peak())

    def progress(self):
        from tqdm.auto import tqdm

        p = self.parts
        self._bar = tqdm(total=p.stop_step, initial=self.state.step, unit="step", desc=f"train {p.run}",
                         disable=not (self.progress_enabled and p.dist.is_main), mininterval=1.0, dynamic_ncols=True)
        return self._bar

    def eval_due(self, step: int) -> bool:
        """Periodic validation after step ``step`` (the horizon's own evaluation is the final one)."""
        every = self.parts.cfg.train.eval_every
        return bool(every) and step % every == 0 and step < self.parts.total_steps

    def checkpoint_due(self, step: int) -> bool:
        every = self.parts.cfg.train.ckpt_every
        return bool(every) and step % every == 0 and step < self.parts.stop_step

    def close(self, outcome: str = "ended", requeued: bool = False) -> None:
        self.checkpointer.close()
        if self.parts.compile_cache is not None:
            self.parts.compile_cache.close()  # a push in flight finishes; its outcome goes in the ledger's end
            self._book_startup()
        self.end_ledger(outcome, requeued)
        if self._bar is not None:
            self._bar.close()
        if self.trackers is not None:
            self.trackers.close(complete=outcome == "completed")  # its last write to the run (trackers.json)
        if self.parts.lease is not None:
            # The session's last act on the run, after its last write (a session that takes the freed run
            # must find nothing of this one's still arriving) and before a SLURM requeue.
            self.parts.lease.release()
        attention.ORDER.leave()  # torch's own SDPA order again for whatever the process does next
        self._signals.restore()


def with_horizon(p: session_parts.Parts, total_steps: int) -> session_parts.Parts:
    """The parts training to ``total_steps``: this session stops there at the latest (or earlier, where its
    --stop-after-steps says). The schedule follows, a pure function of (step, horizon)."""
    stop = min(p.stop_step, total_steps) if p.stop_step < p.total_steps else total_steps
    return dataclasses.replace(p, total_steps=total_steps, stop_step=stop)


_F32 = struct.Struct("<f")


def f32_running_sum(values: list[float]) -> float:
    """The sum of fp32 ``values`` added one at a time in fp32, from zero, as a running sum on the device would.

    Each addition is done in double and rounded to fp32: double holds more than twice fp32's precision, so
    that is the correctly rounded fp32 sum, bit for bit (a numpy float32 cumulative sum is the same, at ten
    times the host time for the few values of a step)."""
    acc = 0.0
    for v in values:
        try:
            acc = _F32.unpack(_F32.pack(acc + v))[0]
        except OverflowError:  # past fp32's largest finite value: fp32 addition gives an infinity
            acc = math.copysign(math.inf, acc + v)
    return acc
