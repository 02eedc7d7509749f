"""The training loop. Everything it calls is built beforehand by the Session; read it top to bottom.

Run as ``torchrun -m baton.train --config C`` (or through ``baton train``); a single process needs no
launcher.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any

import torch

from . import dist, faults, finishing, rollback
from .config import Config
from .errors import BatonError
from .parallel import norm_value
from .schedule import factor_for
from .session import Session

log = logging.getLogger(__name__)


def train_step(s: Session, step: int) -> dict[str, Any]:
    """One optimizer step over this rank's share of global batch ``step``."""
    cfg = s.cfg
    lr = cfg.optim.lr * factor_for(cfg.optim, step, s.total_steps)
    for group in s.optimizer.param_groups:
        group["lr"] = lr
    t0 = time.perf_counter()
    loss_sum = torch.zeros((), device=s.device)
    for j, (x, y) in enumerate(s.micro_batches(step)):
        with s.no_sync(last_micro=j == s.accum - 1):
            loss = s.micro_loss(s.model, x, y)  # forward under autocast, fp32 cross-entropy; compiled or not
            s.scaler.scale(loss / s.accum).backward()
        loss_sum += loss.detach()
    s.scaler.unscale_(s.optimizer)
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
    grad_norm = norm_value(torch.nn.utils.clip_grad_norm_(s.model.parameters(), clip))
    loss_val, batch_sha = s.reduce_step(float(loss_sum) / s.accum)
    finite = math.isfinite(loss_val) and math.isfinite(grad_norm)
    if s.scaler.is_enabled():
        scale = s.scaler.get_scale()
        s.scaler.step(s.optimizer)  # skips the update itself when gradients overflowed
        s.scaler.update()
        skipped = s.scaler.get_scale() < scale
    else:
        skipped = not finite  # grad_norm is post all-reduce, so every rank takes the same branch
        if not skipped:
            s.optimizer.step()
    s.optimizer.zero_grad(set_to_none=True)
    dt = time.perf_counter() - t0
    tokens = cfg.train.global_batch * cfg.data.seq_len
    return {"loss": loss_val, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tokens / dt,
            "step_seconds": dt, "skipped": bool(skipped), "batch_sha": batch_sha}


def train(s: Session) -> dict[str, Any]:
    """Train from the resumed step to the stop boundary, then hand on the baton."""
    step, t0, start = s.step, time.perf_counter(), s.step
    s.progress()
    while step < s.stop_step:
        stop, timed_checkpoint = s.at_boundary(step)  # signal, time budget, timed cadence: agreed by all ranks
        if stop:
            log.info("stopping at step %d: %s", step, stop)
            break
        if timed_checkpoint and step > start and s.last_checkpoint_step != step:
            s.checkpoint(step)
        dist.fault_point(s.dist.rank, step)
        faults.point("step", step)
        m = train_step(s, step)
        track_nonfinite(s, m, step)
        step += 1
        spike = rollback.judge(s, step, m)
        if s.eval_due(step):  # its values go in this step's metrics row
            m.update(finishing.validate(s, step))
        s.record(step, m)
        if spike is not None and rollback.roll_back(s, spike):
            step = s.step  # back at the checkpoint before the spike, its data skipped
            continue
        # A checkpoint due in a run of non-finite steps waits for a finite one, so the pointer keeps
        # naming the state from before the trouble.
        if s.checkpoint_due(step) and not s.stats.consecutive_nonfinite:
            s.checkpoint(step)
    elapsed = time.perf_counter() - t0
    if step > start and s.last_checkpoint_step != step:  # a session that trained ends with a verified checkpoint
        s.checkpoint(step)
    if step == s.total_steps:
        finishing.finish(s)
        if s.trackers is not None and s.val:
            s.trackers.final(step, s.val)
    tokens = (step - start) * s.cfg.train.global_batch * s.cfg.data.seq_len
    summary = finishing.summary(s, tokens / elapsed if elapsed > 0 and tokens else 0.0)
    finishing.write_summary(s, summary)
    log.info("TRAIN DONE step=%d/%d tokens_consumed=%s", step, s.total_steps, f"{summary['tokens_consumed']:,}")
    return summary


def track_nonfinite(s: Session, m: dict[str, Any], step: int) -> None:
    if not m["skipped"]:
        s.stats.consecutive_nonfinite = 0
        return
    s.stats.nonfinite_skips += 1
    s.stats.consecutive_nonfinite += 1
    n = s.stats.consecutive_nonfinite
    # Numbered like metrics.jsonl and checkpoints: the update that would have made step ``step + 1``.
    log.warning("step %d skipped: non-finite loss or gradient (loss=%s, grad_norm=%s); %d in a row, %d in this run",
                step + 1, m["loss"], m["grad_norm"], n, s.stats.nonfinite_skips)
    if n >= s.cfg.train.max_nonfinite:
        last = s.last_checkpoint_step
        raise BatonError(
            f"{n} consecutive steps ({step + 2 - n}-{step + 1}) had non-finite loss or gradients, the limit "
            f"train.max_nonfinite={s.cfg.train.max_nonfinite}; stopped without saving. The pointer still names "
            f"{f'step {last}' if last is not None else 'no checkpoint of this run'}: lower optim.lr (or use bf16 "
            "instead of fp16), or check the data, then resume"
        )


def run(cfg: Config, resume: str = "auto", stop_after: int | None = None, progress: bool = True,
        deadline: float | None = None, started: float | None = None,
        allow_change: tuple[str, ...] = ()) -> dict[str, Any]:
    s = Session(cfg, resume=resume, stop_after=stop_after, progress=progress, deadline=deadline, started=started,
                allow_change=allow_change)
    outcome = "failed"
    try:
        if s.complete_pointer is not None:
            p = s.complete_pointer
            log.info("run %r is complete in %s: step %d/%d, val_loss %s; final model at %s/final. Nothing to do.",
                     s.run, s.store.describe(), p["step"], s.total_steps,
                     f"{p['val_loss']:.4f}" if isinstance(p.get("val_loss"), float) else "n/a", s.run)
            outcome = "nothing to do: the run is complete"
            return {"complete": True, "steps_done": p["step"], "total_steps": s.total_steps}
        summary = train(s)
        outcome = session_outcome(s, summary["steps_done"])
        return summary
    except BaseException as e:  # the ledger records why the session ended, then the error goes on
        outcome = f"failed: {type(e).__name__}: {e}"
        raise
    finally:
        s.close(outcome)


def session_outcome(s: Session, step: int) -> str:
    if step >= s.total_steps:
        return "completed"
    if s.stopped_by:
        return f"stopped: {s.stopped_by}"
    return f"stopped at step {step} (--stop-after-steps)"


def main(argv: list[str] | None = None) -> int:
    """Entry point for torchrun: ``torchrun --nproc-per-node N -m baton.train <train flags>``."""
    from .cli import main as cli_main

    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
