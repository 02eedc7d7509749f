"""Loss spikes: a robust test of each step's loss against a rolling window of the losses before it.

A loss is a spike when it lies above the window's median by more than ``threshold`` robust standard
deviations (1.4826 x the median absolute deviation, the MAD's scale for normal noise). Median and MAD
ignore the odd outlier inside the window, and a falling loss (early training) never looks like a spike.
The spread has a floor of ``REL_FLOOR`` of the median, so a window of nearly equal losses does not turn
noise into spikes.

Every finite loss joins the window once judged, spikes too: a lasting shift of the loss (a new data
mix) is flagged for a while and then becomes the baseline, instead of being flagged forever; the median
and MAD keep a lone spike from moving the baseline. A rollback restores the window of the checkpoint it
returns to, so a spike it undid is not remembered. Non-finite losses are the non-finite guard's business
and are not judged. The window is plain floats, saved with a
checkpoint (``state()``/``restore()``), so a resumed run judges every later step exactly as an
uninterrupted one would.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

MAD_SCALE = 1.4826
REL_FLOOR = 0.01


@dataclass(frozen=True)
class Spike:
    step: int  # the step whose loss spiked (numbered like metrics.jsonl: the update that made it)
    loss: float
    median: float  # of the window before it
    sigma: float  # the robust spread the score is measured in
    score: float  # (loss - median) / sigma

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (f"loss {self.loss:.4f} at step {self.step} is {self.score:.1f} robust sigmas above the median "
                f"{self.median:.4f} of the recent losses")


class SpikeDetector:
    def __init__(self, threshold: float = 6.0, window: int = 50, history: list[float] | None = None):
        self.threshold = threshold
        self.losses: deque[float] = deque(history or (), maxlen=window)
        self._ordered = sorted(self.losses)  # the same window, kept sorted: the median without a sort per step

    def observe(self, step: int, loss: float) -> Spike | None:
        """Judge ``loss`` of ``step`` against the window before it (a spike or None), then add it to the window."""
        if not math.isfinite(loss):
            return None
        spike = None
        if len(self.losses) == self.losses.maxlen:
            med = _median(self._ordered)
            floor = REL_FLOOR * abs(med)
            # The spread is at least ``floor``, so a loss within half the threshold's reach of it cannot score
            # above the threshold (half: a margin far wider than any rounding): most steps end here, without
            # the MAD's sort.
            if loss - med > 0.5 * self.threshold * floor:
                sigma = max(MAD_SCALE * _median(sorted([abs(x - med) for x in self.losses])), floor)
                score = (loss - med) / sigma if sigma > 0 else (math.inf if loss > med else 0.0)
                if score > self.threshold:
                    spike = Spike(step, loss, med, sigma, score)
            del self._ordered[bisect_left(self._ordered, self.losses[0])]  # leaves the window as ``loss`` joins
        self.losses.append(loss)
        insort(self._ordered, loss)
        return spike

    def state(self) -> list[float]:
        return list(self.losses)


def _median(ordered: list[float]) -> float:
    """statistics.median of an already sorted list, the same arithmetic (it runs every step)."""
    h = len(ordered) // 2
    return ordered[h] if len(ordered) % 2 else (ordered[h - 1] + ordered[h]) / 2


def detector(train_cfg, history: list[float] | None = None) -> SpikeDetector:
    """The detector a ``[train]`` section configures."""
    return SpikeDetector(train_cfg.spike_threshold, train_cfg.spike_window, history)
