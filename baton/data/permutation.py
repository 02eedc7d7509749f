"""A keyed bijection over [0, n): the global order of training windows, never materialised.

An alternating (unbalanced) Feistel network over the smallest power-of-two domain covering n, with
cycle-walking to stay inside [0, n). Why this is a bijection on [0, n):

1. Each round maps a b-bit value ``x = (hi, lo)`` to ``(lo, hi ^ F(lo))``; given the output, ``lo`` is
   read back directly and ``hi = out_low ^ F(lo)``, so every round is invertible, and so is the network
   (``Permutation.position`` is that inverse). The network is a bijection of [0, 2^b).
2. Cycle-walking re-applies the network until the value lands in [0, n). Restricting a permutation of a
   finite set to a subset this way yields a permutation of the subset: following the network's cycle from
   x < n, the first value < n reached is unique to x, and walking backwards from it returns to x.
   The domain is below 2n, so a lookup walks fewer than two times on average.

Memory is O(1) and a lookup is a few dozen integer operations, so the order of 10^10 windows costs nothing
to hold and resuming at any sample is arithmetic, not iteration. Round keys come from SHA-512 of
(seed, epoch), so each epoch has its own order, and the order does not depend on numpy's generators.
"""

from __future__ import annotations

import hashlib

import numpy as np

ALGORITHM = "feistel-alt-splitmix-sha512-v2"
ROUNDS = 6
SCALAR_WALK = 8  # cycle-walk leftovers up to this many are finished one by one
_M64 = (1 << 64) - 1
_GOLD, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_NGOLD, _NM1, _NM2 = np.uint64(_GOLD), np.uint64(_M1), np.uint64(_M2)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64 finaliser of (x + key): a well-spread round function (uint64 arithmetic wraps)."""
    z = x + key
    z *= _NGOLD
    z ^= z >> _S30
    z *= _NM1
    z ^= z >> _S27
    z *= _NM2
    z ^= z >> _S31
    return z


def round_keys(seed: int, epoch: int) -> list[int]:
    digest = hashlib.sha512(f"baton-permutation|{int(seed)}|{int(epoch)}".encode()).digest()
    return [int.from_bytes(digest[8 * r : 8 * r + 8], "little") for r in range(ROUNDS)]


class Permutation:
    """``perm[i]`` for i in [0, n) is a distinct index in [0, n); ``perm.take(array)`` is vectorised."""

    def __init__(self, n: int, seed: int, epoch: int = 0):
        if n <= 0:
            raise ValueError("permutation size must be positive")
        self.n, self.seed, self.epoch = int(n), int(seed), int(epoch)
        bits = max(2, (self.n - 1).bit_length())
        self.keys = round_keys(self.seed, self.epoch)
        # Round r splits the value into a high part of hi_bits[r] and a low part of the rest; the roles
        # alternate, so an odd bit count needs no padding to an even one (which would double the domain).
        a, b = bits // 2, bits - bits // 2
        self._splits = [(a, b) if r % 2 == 0 else (b, a) for r in range(ROUNDS)]
        self._rounds = [(hb, lb, (1 << lb) - 1, (1 << hb) - 1, k) for (hb, lb), k in zip(self._splits, self.keys)]
        self._np_rounds = [
            (np.uint64(hb), np.uint64(lb), np.uint64((1 << lb) - 1), np.uint64((1 << hb) - 1), np.uint64(k))
            for (hb, lb), k in zip(self._splits, self.keys)
        ]

    # ---- vectorised (in-place where possible: on a batch of indices the per-call overhead dominates)
    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        for hb, lb, lo_mask, hi_mask, k in self._np_rounds:
            lo = x & lo_mask
            z = _mix(lo, k)
            z &= hi_mask
            z ^= x >> lb
            lo <<= hb
            lo |= z
            x = lo
        return x

    def _decrypt(self, y: np.ndarray) -> np.ndarray:
        for hb, lb, _lo_mask, hi_mask, k in reversed(self._np_rounds):
            lo = y >> hb
            z = _mix(lo, k)
            z &= hi_mask
            z ^= y & hi_mask
            z <<= lb
            z |= lo
            y = z
        return y

    def _walk(self, x: np.ndarray, step) -> np.ndarray:
        y = step(x)
        n = np.uint64(self.n)
        out = np.flatnonzero(y >= n)
        while out.size:  # terminates: every orbit through [0, n) returns to [0, n)
            if out.size <= SCALAR_WALK and step == self._encrypt:
                # A few stragglers: plain-int rounds cost less than another pass of array calls.
                for j in out.tolist():
                    y[j] = self._walk_scalar(int(y[j]))
                break
            y[out] = step(y[out])
            out = out[y[out] >= n]
        return y.astype(np.int64)

    def _check(self, idx) -> np.ndarray:
        x = np.asarray(idx, dtype=np.int64)
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"permutation index out of range [0, {self.n})")
        return x.astype(np.uint64)

    def take(self, idx: np.ndarray | list[int]) -> np.ndarray:
        """The permuted values of ``idx`` (int64 array of the same shape)."""
        return self._walk(self._check(idx), self._encrypt)

    def position(self, values: np.ndarray | list[int]) -> np.ndarray:
        """The inverse: the indices whose permuted values are ``values``."""
        return self._walk(self._check(values), self._decrypt)

    # ---- scalar: plain Python ints, a few microseconds a lookup, no array set-up
    def __getitem__(self, i: int) -> int:
        i = int(i)
        if not 0 <= i < self.n:
            raise IndexError(f"permutation index {i} out of range [0, {self.n})")
        return self._walk_scalar(i)

    def _walk_scalar(self, x: int) -> int:
        """Encrypt ``x`` (any value of the domain) until the result lies in [0, n)."""
        n, rounds = self.n, self._rounds
        while True:
            for hb, lb, lo_mask, hi_mask, k in rounds:
                lo = x & lo_mask
                z = ((lo + k) * _GOLD) & _M64
                z = ((z ^ (z >> 30)) * _M1) & _M64
                z = ((z ^ (z >> 27)) * _M2) & _M64
                x = (lo << hb) | ((x >> lb) ^ ((z ^ (z >> 31)) & hi_mask))
            if x < n:
                return x

    def fingerprint(self) -> str:
        """Identity of the order: the algorithm, its parameters and a sample of its output."""
        h = hashlib.sha256(f"{ALGORITHM}|{self.n}|{self.seed}".encode())
        probe = np.unique(np.linspace(0, self.n - 1, num=min(self.n, 256), dtype=np.int64))
        h.update(self.take(probe).astype("<i8").tobytes())
        return h.hexdigest()[:16]
