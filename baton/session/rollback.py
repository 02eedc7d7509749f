"""What a loss spike does to the run (``train.spike_policy``): ``log`` it, ``stop`` the run, or ``rollback``.

A rollback returns to the newest verified checkpoint, which is before the spike (the step that spiked has
not been checkpointed yet), through the ordinary resume from the store; it then skips the stream range
that produced the spike (``train.spike_skip_windows`` windows ending with the spiking batch, never reaching
back before the checkpoint) and trains on. The skipped ranges are part of the data cursor, so every later
checkpoint, resume and rollback addresses the same samples. A session killed after a rollback and before
its next checkpoint resumes from that same checkpoint, meets the same spike on the same losses, and makes
the same rollback: the outcome does not depend on where it was interrupted.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .. import faults
from ..data.reader import merge_range
from ..errors import BatonError
from .spikes import Spike

if TYPE_CHECKING:
    from .core import Session

log = logging.getLogger(__name__)


class SpikeStop(BatonError):
    """A loss spike ended the run (``spike_policy = "stop"``, or one rollback too many)."""


def judge(s: Session, step: int, loss: float) -> tuple[Spike | None, dict[str, Any]]:
    """Test the loss of ``step``: a spike that asks for a rollback (or None), and what the step's metrics row
    says of a spike (its score and the windows of its batch; nothing for a normal step)."""
    spike = s.state.spikes.observe(step, loss)
    if spike is None:
        return None, {}
    p = s.parts
    gb = p.cfg.train.global_batch
    # The windows of the batch that made this step: the data cursor names them exactly.
    windows = p.data.train_window_ids((step - 1) * gb, gb).tolist()
    marks = {"spike_score": round(spike.score, 3), "spike_windows": windows}
    train = p.cfg.train
    if train.spike_policy == "stop":
        raise SpikeStop(f"{spike.describe()}; train.spike_policy='stop' ended the run before checkpointing it. "
                        f"{_pointer_note(s)} (inspect the data read at step {step}, or resume with "
                        "train.spike_policy='rollback' to skip it, or 'log' to train through it)")
    log.warning("loss spike: %s (train.spike_threshold=%g); the batch's windows: %s", spike.describe(),
                train.spike_threshold, windows)
    return (spike if train.spike_policy == "rollback" else None), marks


def roll_back(s: Session, spike: Spike) -> bool:
    """All ranks: return to the newest verified checkpoint and skip the spike's data. False (and a logged
    refusal) when no checkpoint precedes the spike; the run then goes on as under ``log``."""
    p = s.parts
    cfg = p.cfg
    s.checkpointer.push_outcome(wait=True)  # the checkpoint in flight is the newest before the spike once verified
    base = s.checkpointer.last_step
    if base is None:
        log.warning("cannot roll back from the spike at step %d: this run has no verified checkpoint before it "
                    "(set train.ckpt_every); going on as under spike_policy='log'", spike.step)
        return False
    done = s.state.stats.rollbacks
    if len(done) >= cfg.train.max_rollbacks:
        raise SpikeStop(f"{spike.describe()}; a rollback would be number {len(done) + 1}, over "
                        f"train.max_rollbacks={cfg.train.max_rollbacks}, so the run stops. {_pointer_note(s)}; "
                        f"skipped so far: {_ranges(p.data.skipped)} (inspect the data, or raise train.max_rollbacks)")
    gb = cfg.train.global_batch
    end = p.data.stream_position(spike.step * gb - 1) + 1  # just past the spiking batch's last sample
    width = cfg.train.spike_skip_windows or gb
    skip = (max(p.data.stream_position(base * gb), end - width), end)
    skipped = merge_range(p.data.skipped, skip)
    record = {"rollback": len(done) + 1, "spike_step": spike.step, "spike_loss": spike.loss,
              "median": spike.median, "score": round(spike.score, 3), "to_step": base, "skip": list(skip)}
    log.warning("rollback %d: back to the verified checkpoint at step %d, skipping stream samples [%d, %d) "
                "(%d windows)", record["rollback"], base, skip[0], skip[1], skip[1] - skip[0])
    faults.point("rollback", spike.step)
    s.checkpointer.book()  # the verified checkpoint gone back to is booked before the trackers rewind to it
    s.reload(base)
    if s.state.step != base:  # a session started from a folder (--resume PATH) may not match the store's pointer
        raise SpikeStop(f"the rollback from the spike at step {spike.step} expected the store's pointer at step "
                        f"{base}, and it names step {s.state.step}: resume from the store (--resume auto) to roll back")
    faults.point("rollback.loaded", base)
    # Earlier rollbacks since the checkpoint are not undone by going back.
    s.rolled_back([*done, record], skipped, {"step": base, "event": "rollback", **record,
                                             "skipped_ranges": _ranges(skipped)})
    return True


def _pointer_note(s: Session) -> str:
    last = s.checkpointer.last_step
    return f"The pointer names step {last}" if last is not None else "This run has no verified checkpoint yet"


def _ranges(ranges) -> list[list[int]]:
    return [list(r) for r in ranges]
