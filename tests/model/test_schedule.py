import math
from itertools import pairwise

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from baton.model.schedule import lr_factor, plateau_share

T = 3814


def test_reference_schedule_numbers():
    assert round(plateau_share(T, 100, 0.8), 3) == 0.774
    assert lr_factor(int(T * 0.8), T, 100, 0.8) == 1.0
    assert lr_factor(round(T * 0.9), T, 100, 0.8) == pytest.approx(0.50, abs=0.01)
    assert lr_factor(T - 1, T, 100, 0.8) == pytest.approx(0.0013, abs=0.00005)


def test_shape_warmup_plateau_decay():
    f = [lr_factor(s, T, 100, 0.8) for s in range(T)]
    assert f[0] == pytest.approx(0.01) and f[99] == 1.0
    assert all(a < b for a, b in zip(f[:99], f[1:100]))  # strictly rising warmup
    assert all(x == 1.0 for x in f[100:3051])
    assert all(a > b for a, b in zip(f[3051:], f[3052:]))  # strictly falling decay
    assert min(f) > 0


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        lr_factor(0, 0)
    with pytest.raises(ValueError):
        lr_factor(-1, 10)


def test_default_is_the_original_schedule_to_the_bit():
    """wsd + linear cooldown + floor 0 (the defaults) is warmup, plateau, linear decay ending one step short of
    zero, written here as that schedule always computed it."""
    from baton.config import OptimConfig
    from baton.model.schedule import factor_for

    o = OptimConfig()
    assert (o.schedule, o.decay_shape, o.min_lr_ratio) == ("wsd", "linear", 0.0)
    for total, warm, start in ((T, 100, 0.8), (20, 4, 0.8), (1000, 0, 0.5), (7, 10, 1.0)):
        d0 = int(total * start)
        o.warmup_steps, o.decay_start = warm, start
        for s in range(total):
            want = (s + 1) / warm if s < warm and s < d0 else 1.0 if s < d0 else max(0.0, (total - s) / (total - d0))
            assert factor_for(o, s, total) == want  # ==, not approx


# total 1000, warmup 50, wsd decay from step 800, floor 0.1: each schedule's factor at the warmup's end (49),
# the decay start (800 for wsd, 50 otherwise), 90 % (900) and the last update (999), from its closed form.
M = 0.1


def _floor(g):
    return M + (1 - M) * g


CLOSED = {
    ("wsd", "linear"): {800: 1.0, 900: _floor(100 / 200), 999: _floor(1 / 200)},
    ("wsd", "cosine"): {800: 1.0, 900: _floor(0.5 * (1 + math.cos(math.pi * 100 / 200))),
                        999: _floor(0.5 * (1 + math.cos(math.pi * 199 / 200)))},
    ("wsd", "1-sqrt"): {800: 1.0, 900: _floor(1 - math.sqrt(100 / 200)), 999: _floor(1 - math.sqrt(199 / 200))},
    ("cosine", None): {50: 1.0, 900: _floor(0.5 * (1 + math.cos(math.pi * 850 / 950))),
                       999: _floor(0.5 * (1 + math.cos(math.pi * 949 / 950)))},
    ("linear", None): {50: 1.0, 900: _floor(100 / 950), 999: _floor(1 / 950)},
}


@pytest.mark.parametrize("schedule,shape", list(CLOSED))
def test_each_schedule_equals_its_closed_form_at_the_landmarks(schedule, shape):
    from baton.model.schedule import landmarks

    at = landmarks(1000, 50, 0.8, schedule)
    assert at == {"warmup_end": 49, "decay_start": 800 if schedule == "wsd" else 50, "at_90pct": 900, "last": 999}
    f = [lr_factor(s, 1000, 50, 0.8, schedule, shape or "linear", M) for s in range(1000)]
    assert f[49] == 1.0 and f[0] == 1 / 50
    for step, want in CLOSED[(schedule, shape)].items():
        assert f[step] == pytest.approx(want, rel=1e-12, abs=1e-12), (schedule, shape, step)
    assert all(b <= a for a, b in pairwise(f[49:]))  # never rising after the warmup
    assert min(f[49:]) > M  # one step short of the floor at the end


def test_preflight_construct_reports_the_configured_shape():
    from baton.config import load_config
    from baton.preflight.static import schedule_shape

    cfg = load_config(None, ["train.steps=1000", "optim.warmup_steps=50", "optim.schedule=wsd",
                             "optim.decay_shape=1-sqrt", "optim.min_lr_ratio=0.1"])
    shape, ok, detail = schedule_shape(cfg)
    assert ok, detail
    assert shape["step_decay_start"] == 800 and shape["factor_decay_start"] == 1.0
    assert shape["factor_at_90pct"] == pytest.approx(CLOSED[("wsd", "1-sqrt")][900], rel=1e-12)
    assert shape["factor_last"] == pytest.approx(CLOSED[("wsd", "1-sqrt")][999], rel=1e-12)
    assert "wsd (1-sqrt cooldown), floor 0.1" in detail
    assert shape["plot"][0].startswith("learning rate: wsd, 1-sqrt cooldown, warmup 50, decay from step 800")


def test_bad_schedule_settings_are_named_in_one_message(baton_cli, make_config):
    r = baton_cli("config", "-c", str(make_config()), "--set", "optim.schedule=cos", "--set", "optim.decay_shape=sqrt",
                  "--set", "optim.min_lr_ratio=1.0", "--set", "train.spike_policy=skip")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    for part in ("optim.schedule='cos' is not one of wsd, cosine, linear",
                 "optim.decay_shape='sqrt' is not one of linear, cosine, 1-sqrt",
                 "optim.min_lr_ratio must be in [0, 1), got 1.0",
                 "train.spike_policy='skip' is not one of log, rollback, stop"):
        assert part in r.stderr
    one = baton_cli("config", "-c", str(make_config()), "--set", "optim.min_lr_ratio=-0.5")
    assert one.returncode == 2
    assert one.stderr.strip().splitlines() == ["baton: error: invalid config: optim.min_lr_ratio must be in [0, 1), got -0.5"]


@settings(max_examples=300, deadline=None)
@given(k=st.integers(1, 10_000), total=st.integers(1, 10**6))
@example(k=2900, total=100)  # 0.29 x 100 is 28.999... as floats
@example(k=5700, total=100)
@example(k=5800, total=100)
def test_a_fraction_of_the_horizon_is_the_step_its_decimal_names(k, total):
    """decay_start written with up to four decimals starts the decay at floor(k / 10^4 x total), computed in
    integers; the schedule's first falling update and the printed landmark are that step."""
    from baton.config import OptimConfig
    from baton.model.schedule import decay_begin, landmarks, plot

    start = float(f"{k // 10_000}.{k % 10_000:04d}")
    want = k * total // 10_000
    assert decay_begin(total, start) == want
    assert landmarks(total, 0, start, "wsd")["decay_start"] == want
    o = OptimConfig(warmup_steps=0, decay_start=start)
    assert f"decay from step {want:,}," in plot(o, total)[0]
    if 0 < want:  # the plateau ends exactly there: 1.0 up to and at the decay's start, below it after
        assert lr_factor(want - 1, total, 0, start) == 1.0
    if want + 1 < total:
        assert lr_factor(want, total, 0, start) == 1.0 and lr_factor(want + 1, total, 0, start) < 1.0


@pytest.mark.parametrize("schedule", ["wsd", "cosine", "linear"])
@pytest.mark.parametrize("total, warmup, floor", [(8, 10, 0.0), (50, 100, 0.1), (2, 4, 0.0), (1, 4, 0.0)])
def test_a_warmup_longer_than_the_plateau_never_jumps_to_the_peak(schedule, total, warmup, floor):
    """A short horizon with the default warmup: the decay begins while the ramp is under way, and starts from the
    ramp's level there (it jumped to the peak, then fell)."""
    f = [lr_factor(s, total, warmup, 0.8, schedule, min_lr_ratio=floor) for s in range(total)]
    ramp = [(s + 1) / warmup for s in range(total)]
    assert all(a <= r + 1e-12 for a, r in zip(f, ramp)), f  # never above the ramp
    rising = max(range(total), key=lambda i: f[i])
    assert all(b <= a + 1e-12 for a, b in zip(f[rising:], f[rising + 1:])), f  # up, then down, once
