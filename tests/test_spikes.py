"""The spike detector and the skipped stream ranges of the data cursor."""

from __future__ import annotations

import math

import numpy as np
import pytest

from baton.data.reader import Cursor, merge_range, stream_positions
from baton.errors import ResumeError
from baton.session.spikes import SpikeDetector


def test_a_spike_is_judged_against_the_median_and_mad_of_the_window():
    d = SpikeDetector(threshold=6.0, window=5)
    losses = [5.0, 4.9, 5.1, 4.8, 5.2]  # median 5.0, MAD 0.1 -> sigma 0.14826
    assert [d.observe(i + 1, x) for i, x in enumerate(losses)] == [None] * 5  # no verdict before the window is full
    assert d.observe(6, 5.8) is None  # 5.4 sigmas: not a spike, joins the window
    spike = d.observe(7, 7.0)  # window 4.9 5.1 4.8 5.2 5.8: median 5.1, MAD 0.2 -> 6.4 sigmas
    assert spike is not None and spike.step == 7 and spike.median == 5.1
    assert spike.score == pytest.approx((7.0 - 5.1) / (1.4826 * 0.2))
    assert d.state() == [5.1, 4.8, 5.2, 5.8, 7.0]  # judged, then part of the window like any loss
    assert d.observe(8, float("nan")) is None and d.observe(9, 3.0) is None  # a falling loss is no spike
    assert d.state() == [4.8, 5.2, 5.8, 7.0, 3.0]  # a non-finite loss is not judged and not kept
    restored = SpikeDetector(6.0, 5, d.state())
    assert restored.observe(10, 20.0) == d.observe(10, 20.0) is not None


def test_the_spread_has_a_floor_so_flat_losses_do_not_turn_noise_into_spikes():
    d = SpikeDetector(threshold=6.0, window=4, history=[2.0] * 4)
    assert d.observe(5, 2.1) is None  # 0.1 above a flat 2.0: 5 sigmas of the 1 % floor
    assert d.observe(6, 2.2) is not None


def test_training_samples_step_over_the_skipped_ranges():
    skipped = merge_range(merge_range((), (10, 14)), (20, 22))
    assert skipped == ((10, 14), (20, 22))
    assert merge_range(skipped, (14, 16)) == ((10, 16), (20, 22))  # touching ranges join
    pos = stream_positions(np.arange(0, 20), skipped)
    want = [p for p in range(40) if not (10 <= p < 14 or 20 <= p < 22)][:20]
    assert pos.tolist() == want


def test_the_cursor_carries_its_skipped_ranges_and_reads_an_older_cursor_without_them():
    c = Cursor(96, 12, 32, 7, "f" * 16, "p" * 16, ((40, 48),))
    d = c.to_dict()
    assert d["skipped"] == [[40, 48]] and Cursor.from_dict(d) == c
    del d["skipped"]
    assert Cursor.from_dict(d).skipped == ()
    with pytest.raises(ResumeError, match="overlaps"):
        Cursor.from_dict({**d, "skipped": [[40, 48], [44, 50]]})


def test_the_drift_check_refuses_a_cursor_that_lost_a_rollback_s_skipped_range():
    from baton.checkpoint.record import Stats

    stats = Stats(rollbacks=[{"skip": [128, 136]}])
    assert stats.lost_skips([[120, 136]]) == []  # merged into a wider range: still skipped
    stats.rollbacks.append({"skip": [200, 208]})
    assert stats.lost_skips([[120, 136]]) == [[200, 208]]
    assert Stats.from_json({}).lost_skips([]) == []  # a checkpoint from before rollbacks existed


@pytest.mark.parametrize("window", [3, 4, 49, 50])
def test_the_detectors_median_is_the_statistics_modules(window):
    """The window's median and MAD are taken every step without statistics.median's overhead: the same values."""
    import statistics

    from baton.session.spikes import MAD_SCALE, _median

    rng = np.random.default_rng(window)
    for _ in range(20):
        xs = [float(x) for x in rng.normal(5.0, 0.3, size=window)]
        med = statistics.median(xs)
        assert _median(sorted(xs)) == med
        assert _median(sorted([abs(x - med) for x in xs])) == statistics.median(abs(x - med) for x in xs)
        d = SpikeDetector(threshold=0.0, window=window, history=xs)
        spike = d.observe(1, 100.0)
        assert spike.median == med and spike.sigma == max(MAD_SCALE * statistics.median(abs(x - med) for x in xs),
                                                          0.01 * abs(med))


@pytest.mark.parametrize("seed", range(4))
def test_the_kept_sorted_window_judges_every_step_as_a_fresh_sort_would(seed):
    """The detector keeps its window sorted and skips the MAD when a loss cannot reach the threshold: over a
    stream with drifts, plateaus, repeats and spikes, every verdict equals the rule computed from scratch."""
    import statistics

    from baton.session.spikes import MAD_SCALE, REL_FLOOR

    rng = np.random.default_rng(seed)
    n = 600
    xs = 4.0 + np.cumsum(rng.normal(-0.002, 0.01, n)) + rng.normal(0, 0.02, n)
    xs[rng.integers(0, n, 12)] += rng.uniform(0.05, 3.0, 12)  # spikes, small and large
    xs[200:260] = 3.5  # a plateau of equal losses: the MAD is 0, the floor decides
    xs[300:303] = 0.0  # a median that can reach 0
    window, threshold = int(rng.integers(3, 40)), float(rng.choice([0.5, 3.0, 6.0]))
    d = SpikeDetector(threshold, window)
    recent: list[float] = []
    flagged = 0
    for step, x in enumerate(xs.tolist()):
        want = None
        if len(recent) == window:
            med = statistics.median(recent)
            sigma = max(MAD_SCALE * statistics.median(abs(v - med) for v in recent), REL_FLOOR * abs(med))
            score = (x - med) / sigma if sigma > 0 else (math.inf if x > med else 0.0)
            want = score if score > threshold else None
        got = d.observe(step, x)
        assert (got.score if got else None) == want, step
        flagged += got is not None
        recent = (recent + [x])[-window:]
    assert d.state() == recent and flagged > 0
