"""Loss-spike watch: a loss far above the median of the recent ones, measured in median absolute deviations.

Median and MAD instead of mean and standard deviation: one spike must not inflate the yardstick that
judges the next, and a slow downward trend barely moves either.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

SPIKE_WINDOW = 100  # recent steps the median and MAD are taken over
MIN_HISTORY = 8  # steps seen before any judgement


@dataclass(frozen=True)
class Spike:
    step: int
    loss: float
    median: float
    mad: float
    score: float  # (loss - median) / mad


class SpikeDetector:
    def __init__(self, window: int = SPIKE_WINDOW, threshold: float = 6.0):
        self.threshold = threshold
        self.recent: deque[float] = deque(maxlen=window)

    def observe(self, step: int, loss: float) -> Spike | None:
        """Judge ``loss`` against the recent window, then add it to the window (a non-finite loss is skipped:
        the non-finite watch owns those)."""
        if not math.isfinite(loss):
            return None
        spike = None
        if self.threshold > 0 and len(self.recent) >= min(MIN_HISTORY, self.recent.maxlen or MIN_HISTORY):
            median = statistics.median(self.recent)
            # A floor on the MAD: a perfectly flat window would make every wobble an infinite score.
            mad = max(statistics.median(abs(x - median) for x in self.recent), 1e-6 * max(abs(median), 1.0))
            score = (loss - median) / mad
            if score > self.threshold:
                spike = Spike(step, loss, median, mad, score)
        self.recent.append(loss)
        return spike
