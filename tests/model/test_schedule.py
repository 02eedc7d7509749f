import pytest

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
