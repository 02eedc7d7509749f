"""The session's side of the checkpoint cycle: the state saved locally in the foreground, pushed in the
background (or at once for a session's last checkpoint), and the outcome booked and agreed by every rank.

The cycle itself (push, verify, pointer, prune) is ``checkpoint.cycle``; what a checkpoint holds is
``checkpoint.state``; the background thread is ``checkpoint.pusher``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from . import dist
from .checkpoint import state as ckstate
from .checkpoint.cycle import PushResult, push_checkpoint
from .checkpoint.pusher import PushFailed
from .data.reader import Cursor
from .drift import state_data
from .errors import BatonError, StoreError
from .model import build_model
from .versions import versions

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger(__name__)


def checkpoint(s: Session, step: int) -> PushResult | None:
    """Save, then push, verify, roll the pointer, prune: in the background while training goes on, except
    for the session's last checkpoint (or with store.async_push off), which is complete on return.

    At most one push is in flight: this first waits for the previous one. All ranks return together or
    raise together; a background failure surfaces at the next step boundary (``push_outcome``).
    """
    t0 = time.time()
    rngs = dist.gather(ckstate.rng_state())
    plain = plain_state(s)  # under FSDP, a collective that gathers the full state to rank 0
    final = step >= s.stop_step or s.stopped_by is not None
    result, err = None, None
    if s.dist.is_main:
        try:
            collect_push(s)
            folder, cursor, save_seconds = save_local(s, step, rngs, *plain)
            s.pending_push = (step, t0, cursor.samples_consumed, save_seconds)
            s.pusher.start(step, lambda: push_checkpoint(s.store, s.run, folder, step, cursor.to_dict(),
                                                         s.cfg.store.verify, s.cfg.store.keep_last))
            if final or not s.pusher.background:
                result = collect_push(s)
        except PushFailed as e:
            err = (e.step, str(e))
        except ckstate.LocalSaveError as e:  # the local disk, not the store: its message says all
            err = (None, str(e))
        except (BatonError, OSError) as e:
            err = (step, f"{type(e).__name__}: {e}")
    err = dist.broadcast(err)
    if err and err[0] is None:
        raise ckstate.LocalSaveError(err[1])
    if err:
        raise _push_error(s, *err)
    s.last_saved_step = step
    return result


def push_outcome(s: Session, wait: bool) -> None:
    """Collective: every rank learns whether rank 0's background push failed (after waiting for the one in
    flight when ``wait``), and all raise together if it did."""
    err = None
    if s.dist.is_main:
        try:
            if wait or s.pusher.failure() is not None:
                collect_push(s)  # a finished push: returns at once
        except PushFailed as e:
            err = (e.step, str(e))
    err = dist.broadcast(err)
    if err:
        raise _push_error(s, *err)


def _push_error(s: Session, step: int, cause: str) -> StoreError:
    # s.parent: the last checkpoint of this run that was verified (None before the first: no pointer yet).
    held = (f"the pointer still names the verified checkpoint at step {s.parent['step']}" if s.parent else
            "the store holds no verified checkpoint of this run yet (no pointer was written)")
    return StoreError(
        f"checkpoint at step {step} was not verified in {s.store.describe()} ({cause}); {held}; the local copy is "
        f"kept in {s.run_dir / 'ckpt'}: fix the store's problem, then rerun the same `baton train` command, which "
        "pushes the kept copy before training on"
    )


def collect_push(s: Session) -> PushResult | None:
    """Rank 0: wait for the push in flight and book it (summary, ledger, budget); raises PushFailed."""
    pending, s.pending_push = s.pending_push, None
    try:
        result = s.pusher.wait()
    except PushFailed:
        if pending is not None and s.ledger is not None:
            s.ledger.checkpoint(pending[0], time.time() - pending[1], False, s.budget.stepping_seconds)
        raise
    if pending is None or result is None:
        return None
    s.parent = ckstate.lineage(result.step, result.files)
    step, t0, samples, save_seconds = pending
    # The whole cycle (save, push, verify, pointer, prune) as if it had run alone: what a final one costs.
    seconds = save_seconds + result.seconds
    s.budget.observe_checkpoint(seconds, at=t0)
    if s.ledger is not None:
        s.ledger.checkpoint(step, seconds, result.verified, s.budget.stepping_seconds)
    if s.trackers is not None and result.verified:
        s.trackers.verified(step)
    s.session_checkpoints.append({"step": step, "samples_consumed": samples, "verified": result.verified,
                                  "seconds": round(result.seconds, 3), "path": result.path})
    log.info("CKPT step %d samples=%d push+verify=%.1fs verified=%s", step, samples, result.seconds,
             result.verified)
    _publish_revision(s, step)
    return result


def _publish_revision(s: Session, step: int) -> None:
    """publish.every: a verified intermediate checkpoint as revision step-N of the published model. It runs
    here, on rank 0, before training goes on; a failure warns and never stops training (the horizon's
    publish, in finishing, is the one that must succeed)."""
    from .publish import publish, revision_for

    revision = revision_for(s.cfg, step, s.total_steps)
    if not revision:
        return
    try:
        publish(s.cfg, step, revision)
    except (BatonError, OSError) as e:
        log.warning("could not publish step %d as revision %s of %s (%s); `baton publish --step %d --revision %s` "
                    "retries it", step, revision, s.cfg.publish.url, e, step, revision)


def plain_state(s: Session) -> tuple[torch.nn.Module, torch.optim.Optimizer] | None:
    """The full model and optimizer on rank 0 (every rank must call this at the same point)."""
    from .session import adamw

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model = build_model(s.cfg.model, "cpu")
        return model, adamw(model, s.cfg, torch.device("cpu"))

    return s.parallel.plain(s.model, s.optimizer, build)


def save_local(s: Session, step: int, rngs: list[dict[str, Any]], model: torch.nn.Module,
               optimizer: torch.optim.Optimizer) -> tuple[Path, Cursor, float]:
    """Write the checkpoint folder locally (in the foreground: it is the state at this step). Returns the
    folder, the data cursor at this step and the seconds the save took."""
    t0 = time.time()
    cfg = s.cfg
    cursor = s.data.cursor(step * cfg.train.global_batch, step)
    state = {
        "step": step,
        "total_steps": s.total_steps,
        "cursor": cursor.to_dict(),
        "scheduler": {"kind": cfg.optim.schedule, "step": step, "total_steps": s.total_steps,
                      "warmup_steps": cfg.optim.warmup_steps, "decay_start": cfg.optim.decay_start,
                      "decay_shape": cfg.optim.decay_shape, "min_lr_ratio": cfg.optim.min_lr_ratio},
        "scaler": s.scaler.state_dict() if s.scaler.is_enabled() else None,
        "rng": {"world_size": s.world, "ranks": rngs},
        "stats": {"nonfinite_skips": s.stats.nonfinite_skips,
                  "consecutive_nonfinite": s.stats.consecutive_nonfinite, "last_loss": s.stats.last_loss,
                  # the spike detector's window and the rollbacks so far: a resume judges losses as before
                  "spike_window": s.spikes.state(), "rollbacks": s.stats.rollbacks},
        "config": cfg.to_dict(),
        "versions": versions(),
        "params": s.n_params,
        "data": state_data(cfg.to_dict(), s.data.fingerprint, s.tokenizer_sha256),
        # The verified checkpoint this one follows, and the session that saved it: how a later session
        # knows whether this folder, left unpushed on disk, continues the store's line of work.
        "parent": s.parent,
        "session": s.ledger.id if s.ledger is not None else None,
    }
    folder = ckstate.save_checkpoint(s.run_dir / "ckpt" / f"step-{step}", model, optimizer, state, s.metrics_path)
    return folder, cursor, time.time() - t0
