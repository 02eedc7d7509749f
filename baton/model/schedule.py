"""The learning-rate schedule, as a multiplier on the peak LR: linear warmup, then one of

- ``wsd`` (the default): a plateau at the peak, then a cooldown from ``decay_start`` of the horizon (or from
  step ``decay_step``, where set: a cooldown branch's branch point), shaped ``linear``, ``cosine`` or ``1-sqrt``;
- ``cosine``: a cosine from the end of the warmup over the rest of the horizon;
- ``linear``: a straight line from the end of the warmup over the rest of the horizon;

each falling towards ``min_lr_ratio`` of the peak. The decay's progress is ``(step - d0) / (total - d0)``, so
the final update is one step short of the floor: no update is wasted at the floor (at LR 0, for the default
floor). ``wsd`` + ``linear`` + ``min_lr_ratio = 0`` is the schedule baton always had, to the bit.

Pure functions of the step, so the schedule's whole state is the step counter and resume is exact.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

from ..config import SCHEDULES


@functools.lru_cache(maxsize=64)  # every step asks it again (the decay's start), and the Fraction costs 20 µs
def horizon_step(total_steps: int, fraction: float) -> int:
    """The step a fraction of the horizon names: the floor of ``fraction x total_steps`` taken on the decimal
    the fraction was written as (0.29 of 100 is 29), not on its binary float (0.29 x 100 = 28.999...). The one
    rule every fraction-of-horizon setting and landmark becomes a step by."""
    return math.floor(Fraction(repr(float(fraction))) * total_steps)


def decay_begin(total_steps: int, decay_start: float = 0.8, schedule: str = "wsd", warmup_steps: int = 0,
                decay_step: int = 0) -> int:
    """First optimizer step (0-based) of the decay phase: ``decay_step`` when set, else ``decay_start`` of the
    horizon for ``wsd``; the end of the warmup (at most the last step) for ``cosine`` and ``linear``."""
    if schedule == "wsd":
        return decay_step if decay_step else horizon_step(total_steps, decay_start)
    return min(warmup_steps, total_steps - 1)


def _decay(k: int, n: int, shape: str) -> float:
    """The decay's fall from 1 at progress k/n = 0 towards 0 at k/n = 1."""
    if shape == "linear":
        return max(0.0, (n - k) / n)  # written as the original schedule computed it: the same float
    p = min(1.0, k / n)
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(p)
    raise ValueError(f"unknown decay shape {shape!r}")


def lr_factor(step: int, total_steps: int, warmup_steps: int = 100, decay_start: float = 0.8,
              schedule: str = "wsd", decay_shape: str = "linear", min_lr_ratio: float = 0.0,
              decay_step: int = 0) -> float:
    """Multiplier on the peak LR for the update with 0-based index ``step``.

    Warmup ramps (step+1)/warmup so the first update is not at LR 0 (a decay that begins before the warmup ends
    starts from the ramp's level there instead of 1.0). The decay runs from 1.0 at
    ``decay_begin`` to ``min_lr_ratio + (1 - min_lr_ratio) * shape((n-1)/n)`` at the final update (n the decay's
    length), i.e. it would reach the floor one step past the horizon.
    """
    if total_steps <= 0:
        raise ValueError("total_steps must be positive")
    if step < 0:
        raise ValueError("step must be >= 0")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}")
    shape = decay_shape if schedule == "wsd" else {"cosine": "cosine", "linear": "linear"}[schedule]
    d0 = decay_begin(total_steps, decay_start, schedule, warmup_steps, decay_step)
    if step < warmup_steps and step < d0:
        return (step + 1) / warmup_steps
    if step < d0:
        return 1.0
    fall = _decay(step - d0, total_steps - d0, shape)
    if warmup_steps > d0:
        # A warmup still under way where the decay begins (a short horizon): the decay starts from the level
        # the ramp reached, not from the peak it never got to (that was a jump up, then down).
        top = (d0 + 1) / warmup_steps
        floor = min(min_lr_ratio, top)
        return floor + (top - floor) * fall
    if min_lr_ratio == 0.0:
        return fall
    return min_lr_ratio + (1.0 - min_lr_ratio) * fall


def factor_for(cfg_optim, step: int, total_steps: int) -> float:
    """``lr_factor`` with the schedule settings of an ``[optim]`` section."""
    o = cfg_optim
    return lr_factor(step, total_steps, o.warmup_steps, o.decay_start, o.schedule, o.decay_shape, o.min_lr_ratio,
                     o.decay_step)


def plateau_share(total_steps: int, warmup_steps: int = 100, decay_start: float = 0.8, schedule: str = "wsd",
                  decay_step: int = 0) -> float:
    """Share of all updates that run at the peak LR (factor exactly 1.0, outside warmup)."""
    d0 = decay_begin(total_steps, decay_start, schedule, warmup_steps, decay_step)
    return max(0, d0 - warmup_steps) / total_steps


def landmarks(total_steps: int, warmup_steps: int, decay_start: float, schedule: str,
              decay_step: int = 0) -> dict[str, int]:
    """The steps (0-based updates) where a schedule is judged: warmup end, decay start, 90 %, the last."""
    return {"warmup_end": max(0, min(warmup_steps, total_steps) - 1),
            "decay_start": decay_begin(total_steps, decay_start, schedule, warmup_steps, decay_step),
            "at_90pct": min(total_steps - 1, horizon_step(total_steps, 0.9)),
            "last": total_steps - 1}


def sketch(factor, total_steps: int, width: int = 60, height: int = 6) -> list[str]:
    """A text plot of ``factor(step)`` over the horizon: ``height`` rows of ``width`` columns."""
    cols = [factor(min(total_steps - 1, (c * total_steps) // width)) for c in range(width)]
    rows = []
    for r in range(height, 0, -1):
        lo = (r - 1) / height
        rows.append(f"{r / height:4.2f} |" + "".join("█" if v > lo + 0.5 / height else
                                                      ("▄" if v > lo else " ") for v in cols))
    rows.append("     +" + "-" * width)
    rows.append(f"      step 0{' ' * (width - 12 - len(str(total_steps)))}step {total_steps}")
    return rows


def plot(optim, total_steps: int) -> list[str]:
    """A titled text plot of the schedule an ``[optim]`` section configures, over ``total_steps``."""
    at = landmarks(total_steps, optim.warmup_steps, optim.decay_start, optim.schedule, optim.decay_step)
    cooldown = f", {optim.decay_shape} cooldown" if optim.schedule == "wsd" else ""
    title = (f"learning rate: {optim.schedule}{cooldown}, warmup {optim.warmup_steps}, decay from step "
             f"{at['decay_start']:,}, floor {optim.min_lr_ratio:g} x {optim.lr:g}")
    return [title, *sketch(lambda s: factor_for(optim, s, total_steps), total_steps)]
