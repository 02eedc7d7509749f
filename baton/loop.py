"""The training loop. Everything it calls is built beforehand by the Session; read it top to bottom.

Run through ``baton train`` (each rank of ``--nproc N`` runs ``python -m baton.cli train``); a single
process needs no launcher. Nothing imports this module back: the command line calls ``run``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch

from . import faults
from .config import Config
from .errors import BatonError, Fenced
from .guard import without_credentials
from .model.optimizer import set_lr
from .model.schedule import factor_for
from .runtime import dist
from .runtime.parallel import replicated
from .session import anytime, rollback
from .session import finish as finishing
from .session.core import Session

log = logging.getLogger(__name__)


def train_step(s: Session, step: int) -> dict[str, Any]:
    """One optimizer step over this rank's share of global batch ``step``.

    The step waits for the device once: after the backward pass, for the loss, the gradient norm and the fp16
    overflow flag, read together (``Session.reduce_step``), because whether the update runs is decided on the
    host. Nothing else in the step copies a value to the host (tests/session/test_step_syncs.py counts)."""
    p = s.parts
    cfg = p.cfg
    lrs = set_lr(p.optimizer, cfg.optim, factor_for(cfg.optim, step, p.total_steps))  # each at its own peak
    t0 = time.perf_counter()
    losses = []  # each micro-batch's loss, on the device: summed where they are read (reduce_step)
    for j, (x, y) in enumerate(s.micro_batches(step)):
        with s.no_sync(last_micro=j == p.accum - 1):
            loss = p.micro_loss(p.model, x, y)  # forward under autocast, fp32 cross-entropy; compiled or not
            p.scaler.scale(loss / p.accum).backward()
        losses.append(loss)
    p.scaler.unscale_(p.optimizer)
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
    grad_norm = replicated(torch.nn.utils.clip_grad_norm_(p.model.parameters(), clip))
    v = s.reduce_step(losses, grad_norm, overflow_flag(p.scaler, p.optimizer))
    if p.scaler.is_enabled():
        skipped = v.overflow  # the scaler lowers its scale exactly then (update, below)
        if getattr(p.optimizer, "_step_supports_amp_scaling", False):
            p.scaler.step(p.optimizer)  # a fused optimizer skips the update on the device, from the same flag
        elif not skipped:
            p.optimizer.step()  # what scaler.step does once its own read of the flag finds no overflow
        p.scaler.update()
    else:
        # grad_norm is post all-reduce, so every rank takes the same branch
        skipped = not (math.isfinite(v.loss) and math.isfinite(v.grad_norm))
        if not skipped:
            p.optimizer.step()
    p.optimizer.zero_grad(set_to_none=True)
    dt = time.perf_counter() - t0
    tokens = cfg.train.global_batch * cfg.data.seq_len
    return {"loss": v.loss, **lrs, "grad_norm": v.grad_norm, "tokens_per_s": tokens / dt,
            "step_seconds": dt, "skipped": skipped, "batch_sha": v.batch_sha}


def overflow_flag(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
    """After ``scaler.unscale_(optimizer)``: the device's flag (non-zero when a gradient is inf or NaN) that
    ``scaler.step`` would read and ``scaler.update`` lowers the scale on; None without a scaler. Under FSDP the
    unscale already summed it over the ranks' shards."""
    if not scaler.is_enabled():
        return None
    flags = list(scaler._found_inf_per_device(optimizer).values())
    return flags[0] if len(flags) == 1 else torch.stack([f.to(flags[0].device) for f in flags]).sum()


def train(s: Session) -> dict[str, Any]:
    """Train from the resumed step to the stop boundary, then hand on the baton. (Anytime mode may move both:
    read them from ``s.parts``.)"""
    p, st, ckpt = s.parts, s.state, s.checkpointer
    step, t0, start = st.step, time.perf_counter(), st.step
    s.progress()
    anytime.session_start(s)  # the forecast from here; in anytime mode, the horizon it allows
    s.stepping_begins()
    if s.parts.stop_step <= step < s.parts.total_steps:
        log.info("nothing to train: the run is at step %d, and this session stops at step %d (--stop-after-steps): "
                 "give a later step, or leave it out to train on to the horizon (%d)", step, s.parts.stop_step,
                 s.parts.total_steps)
    while step < s.parts.stop_step:
        b = s.agree(step)  # signal, time budget, timed cadence, the push in flight: agreed by all ranks
        if b.fenced:
            raise s.fenced()  # another session holds the run now: no checkpoint, no booking, nothing more
        if b.push_failed:
            ckpt.push_outcome(wait=False)  # raises the push's error on every rank
        if b.push_done:
            ckpt.book()  # rank 0: the ledger, the trackers, publish.every's revision; the others wait
        if b.heartbeat_due:
            s.heartbeat(step)
        if b.signal or b.out_of_time:
            st.stopped_by = s.stop_reason(b)
            ckpt.push_outcome(wait=True)  # the push in flight is verified (or fails) before the session ends
            log.info("stopping at step %d: %s", step, st.stopped_by)
            break
        if b.checkpoint_due and step > start and ckpt.last_step != step:
            checkpoint(s, step)
        dist.fault_point(p.dist.rank, step)
        faults.point("step", step)
        m = train_step(s, step)
        track_nonfinite(s, m, step)
        step += 1
        spike, marks = rollback.judge(s, step, m["loss"])
        m.update(marks)  # a spike's score and windows go in this step's metrics row
        if s.eval_due(step):  # its values go in this step's metrics row
            m.update(finishing.validate(s, step))
        s.record(step, m)
        if spike is not None and rollback.roll_back(s, spike):
            step = st.step  # back at the checkpoint before the spike, its data skipped
            continue
        # A checkpoint due in a run of non-finite steps waits for a finite one, so the pointer keeps
        # naming the state from before the trouble.
        if s.checkpoint_due(step) and not st.stats.consecutive_nonfinite:
            checkpoint(s, step)
    elapsed = time.perf_counter() - t0
    s.note_peak()  # the steps since the last log interval
    if step > start and ckpt.last_step != step:  # a session that trained ends with a verified checkpoint
        checkpoint(s, step)
    ckpt.book()
    if step == s.parts.total_steps:
        finishing.finish(s)
        if s.trackers is not None and st.val and st.val["val_step"] == step:
            s.trackers.final(step, {k: v for k, v in st.val.items() if k != "val_step"})
    tokens = (step - start) * p.cfg.train.global_batch * p.cfg.data.seq_len
    summary = finishing.summary(s, tokens / elapsed if elapsed > 0 and tokens else 0.0)
    finishing.write_summary(s, summary)
    log.info("TRAIN DONE step=%d/%d tokens_consumed=%s", step, s.parts.total_steps, f"{summary['tokens_consumed']:,}")
    return summary


def checkpoint(s: Session, step: int) -> None:
    """A checkpoint, once anytime mode has said which horizon it keeps."""
    anytime.before_checkpoint(s, step)
    s.checkpointer.checkpoint(step)


def track_nonfinite(s: Session, m: dict[str, Any], step: int) -> None:
    if not m["skipped"]:
        s.state.stats.consecutive_nonfinite = 0
        return
    s.state.stats.nonfinite_skips += 1
    s.state.stats.consecutive_nonfinite += 1
    n = s.state.stats.consecutive_nonfinite
    # Numbered like metrics.jsonl and checkpoints: the update that would have made step ``step + 1``.
    log.warning("step %d skipped: non-finite loss or gradient (loss=%s, grad_norm=%s); %d in a row, %d in this run",
                step + 1, m["loss"], m["grad_norm"], n, s.state.stats.nonfinite_skips)
    if n >= s.parts.cfg.train.max_nonfinite:
        last = s.checkpointer.last_step
        raise BatonError(
            f"{n} consecutive steps ({step + 2 - n}-{step + 1}) had non-finite loss or gradients, the limit "
            f"train.max_nonfinite={s.parts.cfg.train.max_nonfinite}; stopped without saving. The pointer still names "
            f"{f'step {last}' if last is not None else 'no checkpoint of this run'}: lower optim.lr (or use bf16 "
            "instead of fp16), or check the data, then resume"
        )


def run(cfg: Config, resume: str = "auto", stop_after: int | None = None, progress: bool = True,
        deadline: float | None = None, started: float | None = None,
        allow_change: tuple[str, ...] = (), take_over: bool = False) -> dict[str, Any]:
    s = Session(cfg, resume=resume, stop_after=stop_after, progress=progress, deadline=deadline, started=started,
                allow_change=allow_change, take_over=take_over)
    outcome, requeued = "failed", False
    try:
        if s.complete_pointer is not None:
            p, done = s.parts, s.complete_pointer
            log.info("run %r is complete in %s: step %d/%d, val_loss %s; final model at %s/final. Nothing to do.",
                     p.run, p.store.describe(), done.step, p.total_steps,
                     f"{done.val_loss:.4f}" if done.val_loss is not None else "n/a", p.run)
            outcome = "nothing to do: the run is complete"
            return {"complete": True, "steps_done": done.step, "total_steps": p.total_steps}
        summary = train(s)
        outcome = session_outcome(s, summary["steps_done"])
        requeued = summary["requeue"]  # done by the process that started the session, once every rank is done
        return summary
    except BaseException as e:  # the ledger records why the session ended, then the error goes on
        # Kept in the store's ledger, which others may read: no URL's credentials, whoever quoted them.
        outcome = without_credentials(f"fenced: {e}" if isinstance(e, Fenced) else f"failed: {type(e).__name__}: {e}")
        raise
    finally:
        s.close(outcome, requeued)


def session_outcome(s: Session, step: int) -> str:
    if step >= s.parts.total_steps:
        return "completed"
    if s.state.stopped_by:
        return f"stopped: {s.state.stopped_by}"
    return f"stopped at step {step} (--stop-after-steps)"

