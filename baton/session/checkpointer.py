"""The session's side of the checkpoint cycle: the state saved locally in the foreground, pushed in the
background (or at once for a session's last checkpoint), and the outcome booked and agreed by every rank.

A finished push is *taken* at a step boundary (in memory: its cost, its lineage) and then *booked* as a
named step of the loop (the ledger, the trackers, ``publish.every``'s revision): store work on rank 0 that the
other ranks wait for in the long object-group wait (``dist.on_main``), never inside the step's collective.

The cycle itself (push, verify, pointer, prune) is ``checkpoint.cycle``; what a checkpoint holds is
``checkpoint.state``; the background thread is ``checkpoint.pusher``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import state as ckstate
from ..checkpoint.cycle import PushResult, push_checkpoint
from ..checkpoint.names import folder_name
from ..checkpoint.pointer import Lineage
from ..checkpoint.pusher import Pusher, PushFailed
from ..checkpoint.record import CheckpointState
from ..data.reader import Cursor
from ..errors import BatonError, Fenced, StoreError
from ..model.llama import build_model
from ..model.optimizer import build_optimizer
from ..runtime import dist
from ..tracking import Trackers
from ..versions import versions
from .clock import TimeBudget
from .drift import hub_commits, state_data
from .parts import Parts
from .sidejobs import soft
from .state import TrainState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Pending:
    """The push in flight: its step, when its save began, the samples it has consumed, the save's seconds."""

    step: int
    t0: float
    samples: int
    save_seconds: float


class Checkpointer:
    """Owns the push in flight and the lineage: the newest verified checkpoint a new one continues."""

    def __init__(self, parts: Parts, state: TrainState, budget: TimeBudget, parent: Lineage | None,
                 metrics_path: Path, trackers: Trackers | None = None, no_pointer: bool = False):
        self.parts = parts
        self.state = state
        self.budget = budget
        self.metrics_path = metrics_path
        self.trackers = trackers  # rank 0's; told of each verified checkpoint (the rows up to it are kept)
        # Rank 0 pushes in the background (store.async_push); every rank learns the outcome at a boundary.
        self.pusher = Pusher(background=parts.cfg.store.async_push)
        self.pending: _Pending | None = None
        self.unbooked: list[int] = []  # steps of verified pushes taken but not yet booked (rank 0)
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

    def rebase(self, parts: Parts, parent: Lineage | None) -> None:
        """A rollback reloaded the session from the verified checkpoint ``parent``: new checkpoints continue it."""
        self.parts, self.parent, self.last_saved_step = parts, parent, None

    def checkpoint(self, step: int) -> None:
        """Save, then push, verify, roll the pointer, prune: in the background while training goes on, except
        for the session's last checkpoint (or with store.async_push off), which is verified on return.

        At most one push is in flight: this first waits for the previous one. All ranks return together or
        raise together; a background failure surfaces at the next step boundary (``push_outcome``).
        """
        p = self.parts
        t0 = time.time()
        rngs = dist.gather(ckstate.rng_state())
        plain = self.plain_state()  # under FSDP, a collective that gathers the full state to rank 0
        final = step >= p.stop_step or self.state.stopped_by is not None

        def save_and_push() -> None:
            assert plain is not None  # rank 0 holds the full state
            try:
                self.take()
                folder, cursor, save_seconds = self._save_local(step, rngs, *plain)
                self.pending = _Pending(step, t0, cursor.samples_consumed, save_seconds)
                self.pusher.start(step, lambda: push_checkpoint(p.store, p.run, folder, step, cursor.to_dict(),
                                                                p.cfg.store.verify, p.cfg.store.keep_last))
                if final or not self.pusher.background:
                    self.take()
            except PushFailed as e:
                raise self._push_error(e.step, str(e)) from None
            except ckstate.LocalSaveError as e:  # the local disk, not the store: nothing there changed
                raise ckstate.LocalSaveError(f"{e}; {self._held()}") from None
            except (BatonError, OSError) as e:
                raise self._push_error(step, f"{type(e).__name__}: {e}") from None

        dist.on_main(save_and_push)
        self.last_saved_step = step

    def push_outcome(self, wait: bool) -> None:
        """Collective: every rank learns whether rank 0's background push failed (after waiting for the one in
        flight when ``wait``), and all raise together if it did."""

        def outcome() -> None:
            try:
                if wait or self.pusher.failure() is not None:
                    self.take()  # a finished push: returns at once
            except PushFailed as e:
                raise self._push_error(e.step, str(e)) from None

        dist.on_main(outcome)

    def finished(self) -> bool:
        """Rank 0: a push ended (verified or failed) and is not taken yet."""
        return self.pending is not None and not self.pusher.in_flight

    def take(self) -> PushResult | None:
        """Rank 0: wait for the push in flight and note it in memory (its cost for the clock, the lineage, the
        summary); raises PushFailed. Its store work (the ledger, the trackers, a revision) waits for ``book``."""
        pending, self.pending = self.pending, None
        try:
            result = self.pusher.wait()
        except PushFailed:
            ledger = self.parts.ledger
            if pending is not None and ledger is not None:  # the session ends with this error: billed now
                ledger.checkpoint(pending.step, time.time() - pending.t0, False, self.budget.stepping_seconds)
            raise
        if pending is None or result is None:
            return None
        self.parent = Lineage.of(result.step, result.files)
        # The whole cycle (save, push, verify, pointer, prune) as if it had run alone: what a final one costs.
        seconds = pending.save_seconds + result.seconds
        self.budget.observe_checkpoint(seconds, at=pending.t0)
        self.saved.append({"step": pending.step, "samples_consumed": pending.samples, "verified": result.verified,
                           "seconds": round(result.seconds, 3), "path": result.path, "cycle_seconds": seconds})
        log.info("CKPT step %d samples=%d push+verify=%.1fs verified=%s", pending.step, pending.samples,
                 result.seconds, result.verified)
        self.unbooked.append(pending.step)
        return result

    def book(self) -> None:
        """All ranks: rank 0 books the verified pushes taken so far: the ledger, the trackers (the rows up to each
        are kept), then ``publish.every``'s revision of each. The other ranks wait for it."""
        dist.on_main(self._book)

    def _book(self) -> None:
        todo, self.unbooked = self.unbooked, []
        ledger = self.parts.ledger
        for step in todo:
            row = next(c for c in reversed(self.saved) if c["step"] == step)
            if ledger is not None:
                ledger.checkpoint(step, row["cycle_seconds"], row["verified"], self.budget.stepping_seconds)
            if self.trackers is not None and row["verified"]:
                trackers = self.trackers
                soft("the trackers", "the next verified checkpoint sends the rows again",
                     lambda: trackers.verified(step))
            self._publish_revision(step)

    def _publish_revision(self, step: int) -> None:
        """publish.every: a verified intermediate checkpoint as revision step-N of the published model. A failure
        of any kind warns and never stops training (the horizon's publish, in session.finish, is the one that
        must succeed)."""
        from ..release.publish import publish, revision_for

        cfg = self.parts.cfg
        revision = revision_for(cfg, step, self.parts.total_steps)
        if revision:
            if self.parts.lease is not None:
                self.parts.lease.verify()  # publish.url is outside the run's store: a fenced session publishes nothing
            soft(f"publishing step {step} as revision {revision} of {cfg.publish.url}",
                 f"`baton publish --step {step} --revision {revision}` retries it",
                 lambda: publish(cfg, step, revision))

    def _push_error(self, step: int, cause: str) -> StoreError:
        p = self.parts
        if p.lease is not None and p.lease.lost is not None:
            return Fenced(p.lease.explain() or "")  # not a store fault: another session holds the run
        return StoreError(
            f"checkpoint at step {step} was not verified in {p.store.describe()} ({cause}); {self._held()}; the local copy "
            f"is kept in {p.run_dir / 'ckpt'}: fix the store's problem, then rerun the same `baton train` command, "
            "which pushes the kept copy before training on"
        )

    def _held(self) -> str:
        """What the store's pointer names after a checkpoint failed to reach it, as far as this session knows."""
        # self.parent: the last checkpoint of this run that was verified, None before the first of a lineage.
        if self.parent:
            return f"the pointer still names the verified checkpoint at step {self.parent.step}"
        if self.no_pointer:
            return "the store holds no verified checkpoint of this run yet (no pointer was written)"
        # --resume PATH: the store's pointer was not resumed from, and this failure did not move it.
        return "the store's pointer was not moved"

    def close(self) -> None:
        if self.parts.dist.is_main:
            # The process never exits with a push in flight, nor with a verified one unbooked; a failure here was
            # already raised or is logged.
            try:
                self.take()
            except PushFailed as e:
                log.error("checkpoint at step %d was not verified: %s", e.step, e)
            soft("booking the last verified checkpoint", "the next session's ledger and trackers catch up",
                 self._book)

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
        p, cfg = self.parts, self.parts.cfg
        cursor = p.data.cursor(step * cfg.train.global_batch, step)
        # The spike detector's window travels with the counters: a resume judges losses as before.
        stats = dataclasses.replace(self.state.stats, spike_window=self.state.spikes.state())
        state = CheckpointState(
            step=step, total_steps=p.total_steps, cursor=cursor.to_dict(), config=cfg.to_dict(), rng_ranks=rngs,
            optimizer_param_groups=[], scaler=p.scaler.state_dict() if p.scaler.is_enabled() else None,
            stats=stats,
            data=state_data(cfg.to_dict(), p.data.fingerprint, p.tokenizer_sha256, hub_commits(p.data.manifest)),
            params=p.n_params, versions=versions(), parent=self.parent,
            session=p.ledger.id if p.ledger is not None else None, shortened=self.state.shortened)
        folder = ckstate.save_checkpoint(p.run_dir / "ckpt" / folder_name(step), model, optimizer, state,
                                         self.metrics_path)
        return folder, cursor, time.time() - t0
