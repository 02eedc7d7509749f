"""A keyed bijection over [0, n): the global order of training windows, never materialised.

A balanced Feistel network over the smallest even-bit domain covering n, with cycle-walking to stay
inside [0, n). Memory is O(1) and one lookup is a few dozen integer operations, so the order of 10^10
windows costs nothing to hold and resuming at any sample is arithmetic, not iteration. Round keys come
from numpy's PCG64 seeded with (seed, epoch), so every epoch gets its own order.
"""

from __future__ import annotations

import hashlib

import numpy as np

ALGORITHM = "feistel-splitmix-v1"
ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64 finaliser of (x + key): a well-spread round function."""
    z = (x + key) * _GOLD
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


class Permutation:
    """``perm[i]`` for i in [0, n) is a distinct index in [0, n); ``perm.take(array)`` is vectorised."""

    def __init__(self, n: int, seed: int, epoch: int = 0):
        if n <= 0:
            raise ValueError("permutation size must be positive")
        self.n, self.seed, self.epoch = int(n), int(seed), int(epoch)
        bits = max(2, int(n - 1).bit_length())
        self.half = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half) - 1)
        rng = np.random.Generator(np.random.PCG64([self.seed, self.epoch]))
        self.keys = [np.uint64(k) for k in rng.integers(0, 2**63, size=ROUNDS, dtype=np.uint64)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        h = np.uint64(self.half)
        left, right = x >> h, x & self.mask
        for k in self.keys:
            left, right = right, left ^ (_mix(right, k) & self.mask)
        return (left << h) | right

    def take(self, idx: np.ndarray | list[int]) -> np.ndarray:
        x = np.asarray(idx, dtype=np.int64)
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"permutation index out of range [0, {self.n})")
        y = self._encrypt(x.astype(np.uint64))
        n = np.uint64(self.n)
        # Cycle-walking: re-encrypt values that fell outside [0, n). The domain is < 4n, so this
        # loop runs a handful of times at most and terminates because each orbit contains x < n.
        out = y >= n
        while out.any():
            y[out] = self._encrypt(y[out])
            out = y >= n
        return y.astype(np.int64)

    def __getitem__(self, i: int) -> int:
        return int(self.take(np.array([i]))[0])

    def fingerprint(self) -> str:
        """Identity of the order: the algorithm, its parameters and a sample of its output."""
        h = hashlib.sha256(f"{ALGORITHM}|{self.n}|{self.seed}".encode())
        probe = np.unique(np.linspace(0, self.n - 1, num=min(self.n, 256), dtype=np.int64))
        h.update(self.take(probe).astype("<i8").tobytes())
        return h.hexdigest()[:16]
