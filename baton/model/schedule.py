"""The learning-rate schedule: linear warmup -> plateau -> linear decay to zero (WSD / trapezoid).

Pure functions of the step, so the schedule's whole state is the step counter and resume is exact.
"""

from __future__ import annotations


def decay_begin(total_steps: int, decay_start: float = 0.8) -> int:
    """First optimizer step (0-based) of the decay phase."""
    return int(total_steps * decay_start)


def lr_factor(step: int, total_steps: int, warmup_steps: int = 100, decay_start: float = 0.8) -> float:
    """Multiplier on the peak LR for the update with 0-based index ``step``.

    Warmup ramps (step+1)/warmup so the first update is not at LR 0. Decay runs linearly from 1.0 at
    ``decay_begin`` to 1/(total - decay_begin) at the final update, i.e. it would reach 0 one step past
    the horizon, so no update is wasted at LR 0.
    """
    if total_steps <= 0:
        raise ValueError("total_steps must be positive")
    if step < 0:
        raise ValueError("step must be >= 0")
    d0 = decay_begin(total_steps, decay_start)
    if step < warmup_steps and step < d0:
        return (step + 1) / warmup_steps
    if step < d0:
        return 1.0
    return max(0.0, (total_steps - step) / (total_steps - d0))


def plateau_share(total_steps: int, warmup_steps: int = 100, decay_start: float = 0.8) -> float:
    """Share of all updates that run at the peak LR (factor exactly 1.0, outside warmup)."""
    d0 = decay_begin(total_steps, decay_start)
    return max(0, d0 - warmup_steps) / total_steps
