"""The session's side of the checkpoint cycle: the state saved locally in the foreground, pushed in the
background (or at once for a session's last checkpoint), and the outcome booked and agreed by every rank.

The cycle itself (push, verify, pointer, prune) is ``checkpoint.cycle``; what a checkpoint holds is
``checkpoint.state``; the background thread is ``checkpoint.pusher``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import state as ckstate
from ..checkpoint.cycle import PushResult, push_checkpoint
from ..checkpoint.pusher import Pusher, PushFailed
from ..data.reader import Cursor
from ..errors import BatonError, StoreError
from ..model.llama import build_model
from ..model.optimizer import build_optimizer
from ..runtime import dist
from ..tracking import Trackers
from ..versions import versions
from .clock import TimeBudget
from .drift import state_data
from .parts import Parts
from .state import TrainState

log = logging.getLogger(__name__)


class Checkpointer:
    """Owns the push in flight and the lineage: the newest verified checkpoint a new one continues."""

    def __init__(self, parts: Parts, state: TrainState, budget: TimeBudget, parent: dict[str, Any] | None,
                 metrics_path: Path, trackers: Trackers | None = None, no_pointer: bool = False):
        self.parts = parts
        self.state = state
        self.budget = budget
        self.metrics_path = metrics_path
        self.trackers = trackers  # rank 0's; told of each verified checkpoint (the rows up to it are kept)
        # Rank 0 pushes in the background (store.async_push); every rank learns the outcome at a boundary.
        self.pusher = Pusher(background=parts.cfg.store.async_push)
        # (step, start, samples consumed, seconds the save took) of the push in flight, booked when it ends
        self.pending: tuple[int, float, int, float] | None = None
        # The newest verified checkpoint of this lineage: what a checkpoint saved now continues. Recorded in
        # each checkpoint so a later session can tell whether one left unpushed on disk follows the pointer.
        self.parent = parent
        self.no_pointer = no_pointer  # the session found no pointer: until one is verified, the store holds none
        self.saved: list[dict[str, Any]] = []  # this session's checkpoints, for the run summary
        self.last_saved_step: int | None = None  # the newest one this session saved (its push may be in flight)

    @property
    def last_step(self) -> int | None:
        """The step of the newest verified checkpoint this session wrote or resumed from."""
        return self.last_saved_step if self.last_saved_step is not None else self.state.resumed_from

    def checkpoint(self, step: int) -> PushResult | None:
        """Save, then push, verify, roll the pointer, prune: in the background while training goes on, except
        for the session's last checkpoint (or with store.async_push off), which is complete on return.

        At most one push is in flight: this first waits for the previous one. All ranks return together or
        raise together; a background failure surfaces at the next step boundary (``push_outcome``).
        """
        p = self.parts
        t0 = time.time()
        rngs = dist.gather(ckstate.rng_state())
        plain = self.plain_state()  # under FSDP, a collective that gathers the full state to rank 0
        final = step >= p.stop_step or self.state.stopped_by is not None
        result = None
        err: tuple[int | None, str] | None = None
        if p.dist.is_main:
            assert plain is not None
            try:
                self.collect()
                folder, cursor, save_seconds = self._save_local(step, rngs, *plain)
                self.pending = (step, t0, cursor.samples_consumed, save_seconds)
                self.pusher.start(step, lambda: push_checkpoint(p.store, p.run, folder, step, cursor.to_dict(),
                                                                p.cfg.store.verify, p.cfg.store.keep_last))
                if final or not self.pusher.background:
                    result = self.collect()
            except PushFailed as e:
                err = (e.step, str(e))
            except ckstate.LocalSaveError as e:  # the local disk, not the store: nothing there changed
                err = (None, f"{e}; {self._held()}")
            except (BatonError, OSError) as e:
                err = (step, f"{type(e).__name__}: {e}")
        err = dist.broadcast(err)
        if err and err[0] is None:
            raise ckstate.LocalSaveError(err[1])
        if err:
            raise self._push_error(*err)
        self.last_saved_step = step
        return result

    def push_outcome(self, wait: bool) -> None:
        """Collective: every rank learns whether rank 0's background push failed (after waiting for the one in
        flight when ``wait``), and all raise together if it did."""
        err = None
        if self.parts.dist.is_main:
            try:
                if wait or self.pusher.failure() is not None:
                    self.collect()  # a finished push: returns at once
            except PushFailed as e:
                err = (e.step, str(e))
        err = dist.broadcast(err)
        if err:
            raise self._push_error(*err)

    def _push_error(self, step: int, cause: str) -> StoreError:
        p = self.parts
        return StoreError(
            f"checkpoint at step {step} was not verified in {p.store.describe()} ({cause}); {self._held()}; the local copy "
            f"is kept in {p.run_dir / 'ckpt'}: fix the store's problem, then rerun the same `baton train` command, "
            "which pushes the kept copy before training on"
        )

    def _held(self) -> str:
        """What the store's pointer names after a checkpoint failed to reach it, as far as this session knows."""
        # self.parent: the last checkpoint of this run that was verified, None before the first of a lineage.
        if self.parent:
            return f"the pointer still names the verified checkpoint at step {self.parent['step']}"
        if self.no_pointer:
            return "the store holds no verified checkpoint of this run yet (no pointer was written)"
        # --resume PATH: the store's pointer was never read, and this failure did not move it.
        return "the store's pointer was not moved"

    def collect(self) -> PushResult | None:
        """Rank 0: wait for the push in flight and book it (summary, ledger, budget); raises PushFailed."""
        pending, self.pending = self.pending, None
        ledger = self.parts.ledger
        try:
            result = self.pusher.wait()
        except PushFailed:
            if pending is not None and ledger is not None:
                ledger.checkpoint(pending[0], time.time() - pending[1], False, self.budget.stepping_seconds)
            raise
        if pending is None or result is None:
            return None
        self.parent = ckstate.lineage(result.step, result.files)
        step, t0, samples, save_seconds = pending
        # The whole cycle (save, push, verify, pointer, prune) as if it had run alone: what a final one costs.
        seconds = save_seconds + result.seconds
        self.budget.observe_checkpoint(seconds, at=t0)
        if ledger is not None:
            ledger.checkpoint(step, seconds, result.verified, self.budget.stepping_seconds)
        if self.trackers is not None and result.verified:
            self.trackers.verified(step)
        self.saved.append({"step": step, "samples_consumed": samples, "verified": result.verified,
                           "seconds": round(result.seconds, 3), "path": result.path})
        log.info("CKPT step %d samples=%d push+verify=%.1fs verified=%s", step, samples, result.seconds,
                 result.verified)
        self._publish_revision(step)
        return result

    def _publish_revision(self, step: int) -> None:
        """publish.every: a verified intermediate checkpoint as revision step-N of the published model. It runs
        here, on rank 0, before training goes on; a failure warns and never stops training (the horizon's
        publish, in session.finish, is the one that must succeed)."""
        from ..release.publish import publish, revision_for

        cfg = self.parts.cfg
        revision = revision_for(cfg, step, self.parts.total_steps)
        if not revision:
            return
        try:
            publish(cfg, step, revision)
        except (BatonError, OSError) as e:
            log.warning("could not publish step %d as revision %s of %s (%s); `baton publish --step %d --revision %s` "
                        "retries it", step, revision, cfg.publish.url, e, step, revision)

    def close(self) -> None:
        if self.parts.dist.is_main:
            # The process never exits with a push in flight; a failure here was already raised or is logged.
            try:
                self.collect()
            except PushFailed as e:
                log.error("checkpoint at step %d was not verified: %s", e.step, e)

    def plain_state(self) -> tuple[torch.nn.Module, torch.optim.Optimizer] | None:
        """The full model and optimizer on rank 0 (every rank must call this at the same point)."""
        cfg = self.parts.cfg

        def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
            model = build_model(cfg.model, "cpu")
            return model, build_optimizer(model, cfg, torch.device("cpu"))

        return self.parts.parallel.plain(self.parts.model, self.parts.optimizer, build)

    def _save_local(self, step: int, rngs: list[dict[str, Any]], model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer) -> tuple[Path, Cursor, float]:
        """Write the checkpoint folder locally (in the foreground: it is the state at this step). Returns the
        folder, the data cursor at this step and the seconds the save took."""
        t0 = time.time()
        p, cfg, stats = self.parts, self.parts.cfg, self.state.stats
        cursor = p.data.cursor(step * cfg.train.global_batch, step)
        state = {
            "step": step,
            "total_steps": p.total_steps,
            "cursor": cursor.to_dict(),
            "scheduler": {"kind": cfg.optim.schedule, "step": step, "total_steps": p.total_steps,
                          "warmup_steps": cfg.optim.warmup_steps, "decay_start": cfg.optim.decay_start,
                          "decay_shape": cfg.optim.decay_shape, "min_lr_ratio": cfg.optim.min_lr_ratio},
            "scaler": p.scaler.state_dict() if p.scaler.is_enabled() else None,
            "rng": {"world_size": p.world, "ranks": rngs},
            "stats": {"nonfinite_skips": stats.nonfinite_skips,
                      "consecutive_nonfinite": stats.consecutive_nonfinite, "last_loss": stats.last_loss,
                      # the spike detector's window and the rollbacks so far: a resume judges losses as before
                      "spike_window": self.state.spikes.state(), "rollbacks": stats.rollbacks},
            "config": cfg.to_dict(),
            "versions": versions(),
            "params": p.n_params,
            "data": state_data(cfg.to_dict(), p.data.fingerprint, p.tokenizer_sha256),
            # The verified checkpoint this one follows, and the session that saved it: how a later session
            # knows whether this folder, left unpushed on disk, continues the store's line of work.
            "parent": self.parent,
            "session": p.ledger.id if p.ledger is not None else None,
        }
        folder = ckstate.save_checkpoint(p.run_dir / "ckpt" / f"step-{step}", model, optimizer, state,
                                         self.metrics_path)
        return folder, cursor, time.time() - t0
