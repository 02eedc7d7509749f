"""The host's side of the step's one read: the micro-batches' losses summed as the device's fp32 running sum
would, bit for bit (baton/session/core.py ``f32_running_sum``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from baton.session.core import f32_running_sum

F32_MAX = float(np.finfo(np.float32).max)


def device_sum(values: list[float]) -> float:
    """A running sum in fp32 on the device, one addition per micro-batch, from zero."""
    acc = torch.zeros((), dtype=torch.float32)
    for v in values:
        acc = acc + torch.tensor(v, dtype=torch.float32)
    return float(acc)


@pytest.mark.parametrize("seed", range(6))
def test_the_host_sum_equals_the_devices_fp32_running_sum(seed):
    rng = np.random.default_rng(seed)
    for _ in range(300):
        n = int(rng.integers(1, 33))
        scale = 10.0 ** rng.uniform(-30, 38)
        values = (rng.standard_normal(n) * scale).astype(np.float32).tolist()
        got, want = f32_running_sum(values), device_sum(values)
        assert got == want or (math.isnan(got) and math.isnan(want)), values


@pytest.mark.parametrize("values", [
    [F32_MAX, F32_MAX],  # overflows to inf, as fp32 does
    [-F32_MAX, -F32_MAX],
    [F32_MAX, F32_MAX, -F32_MAX],  # stays inf once there
    [math.inf, -math.inf],
    [1.0, math.nan, 2.0],
    [1.0, 2.0 ** -24, 2.0 ** -24],  # each half-ulp addition rounds to even: 1.0, not 1.0 + 2^-23
    [16777216.0, 1.0, 1.0],  # 2^24 + 1 is not an fp32
    [],
])
def test_the_host_sum_follows_fp32_at_its_edges(values):
    got, want = f32_running_sum(values), device_sum(values)
    assert got == want or (math.isnan(got) and math.isnan(want))
