"""The keyed permutation of training windows: a bijection, the same in every process, O(1) at 10^10."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import tracemalloc

import numpy as np
import pytest

from baton.data.permutation import Permutation

SIZES = sorted({*range(1, 300), 1000, 1023, 1024, 1025, 4096, 12345, 65535, 65536, 65537, 99991, 100_000})
KEYS = [(0, 0), (1, 0), (1234, 0), (1234, 1), (-5, 7), (2**40 + 3, 2)]


@pytest.mark.parametrize("seed,epoch", KEYS)
def test_bijection_exhaustive_up_to_1e5(seed, epoch):
    for n in SIZES:
        p = Permutation(n, seed, epoch)
        values = p.take(np.arange(n))
        assert np.array_equal(np.sort(values), np.arange(n)), f"n={n} is not a bijection"
        assert np.array_equal(p.position(values), np.arange(n)), f"n={n}: the inverse disagrees"


def test_scalar_path_matches_vectorised_and_order_is_shuffled():
    for n in (1, 2, 3, 1000, 99991, 10**10):
        p = Permutation(n, 99, 1)
        idx = np.unique(np.linspace(0, n - 1, num=min(n, 500), dtype=np.int64))
        assert [p[int(i)] for i in idx] == p.take(idx).tolist()
    a = Permutation(1000, 1).take(np.arange(1000))
    assert not np.array_equal(a, np.arange(1000))
    assert not np.array_equal(a, Permutation(1000, 2).take(np.arange(1000)))
    assert not np.array_equal(a, Permutation(1000, 1, epoch=1).take(np.arange(1000)))
    # A shuffle, not a shift: about half the positions move right, and few stay put.
    assert 400 < int((a > np.arange(1000)).sum()) < 600 and int((a == np.arange(1000)).sum()) < 10
    with pytest.raises(IndexError):
        p[10**10]
    with pytest.raises(IndexError):
        Permutation(10, 0).take([10])


def _digest(n: int, seed: int, epoch: int) -> str:
    p = Permutation(n, seed, epoch)
    probe = np.unique(np.linspace(0, n - 1, num=min(n, 20000), dtype=np.int64))
    return hashlib.sha256(p.take(probe).astype("<i8").tobytes()).hexdigest() + p.fingerprint()


def test_identical_across_processes():
    cases = [(100_000, 7, 0), (100_000, 7, 3), (10**10, 1234, 0), (2**33 + 1, 5, 1)]
    here = str(__import__('pathlib').Path(__file__).parent)
    code = (f"import json, sys; sys.path.insert(0, {here!r}); from test_data_permutation import _digest; "
            f"print(json.dumps([_digest(*c) for c in {cases!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [_digest(*c) for c in cases]


def test_at_1e10_memory_is_tiny_and_access_is_direct():
    n = 10**10
    tracemalloc.start()
    try:
        p = Permutation(n, 1234, 3)
        rng = np.random.default_rng(0)
        idx = rng.integers(0, n, size=2000)
        scalar = [p[int(i)] for i in idx]
        vec = p.take(idx)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert scalar == vec.tolist()
    assert len(set(scalar)) == len(set(idx.tolist()))  # distinct inputs, distinct outputs
    assert all(0 <= v < n for v in scalar)
    assert p.position(vec).tolist() == idx.tolist()
    assert peak < 100 * 2**20, f"peak traced memory {peak / 2**20:.1f} MiB"
    t = time.perf_counter()
    for i in idx[:1000]:
        p[int(i)]
    per_access = (time.perf_counter() - t) / 1000
    print(f"n=1e10: peak traced memory {peak / 2**20:.2f} MiB, scalar access {per_access * 1e6:.1f} µs")
