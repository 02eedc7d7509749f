"""Geometry (the reference run's numbers) and the exact validation prefix-collision count."""

from __future__ import annotations

from baton.data.geometry import Geometry, prefix_collisions
from baton.data.reader import WindowDataset


def test_reference_geometry():
    # The reference corpus and run: 1,109,714,831 tokens, seq 1024, 195 held-out windows, 3,814 x 262,144.
    g = Geometry.of(1_109_714_831, 1024, 195, 3814, 262_144)
    assert (g.n_windows, g.n_train, g.horizon) == (1_083_705, 1_083_510, 999_817_216)
    assert g.lines() == ["1,109,714,831 tokens → 1,083,705 windows of 1,024 (1,083,510 train, 195 validation)",
                         "horizon 3,814 × 262,144 = 999,817,216 tokens; 11.0 % margin"]
    short = Geometry.of(500_000_000, 1024, 195, 3814, 262_144)
    assert short.margin < 0 and 2.0 < short.epochs < 2.1
    assert "2.00 passes" in short.lines()[2] or "2.01 passes" in short.lines()[2]


def _brute_force(ds: WindowDataset, k: int) -> int:
    L = ds.seq_len
    train = {ds.stream.read(i * L, k).tobytes() for i in range(ds.n_train)}
    return sum(ds.stream.read(int(i) * L, k).tobytes() in train for i in ds.val_window_ids())


def test_prefix_collisions_count_is_exact_across_shard_boundaries(prepared_data):
    for seq, val, k in ((32, 16, 64), (32, 300, 2), (8, 400, 3), (40, 100, 1), (17, 50, 17)):
        ds = WindowDataset(prepared_data, seq, 7, val)
        assert len(ds.stream.shards) > 1
        assert prefix_collisions(ds, k) == _brute_force(ds, min(k, seq)), (seq, val, k)
    # With a one-token prefix collisions are certain, and every one is counted.
    ds = WindowDataset(prepared_data, 16, 7, 10)
    assert prefix_collisions(ds, 1) == _brute_force(ds, 1) > 0
