"""`baton data-info`: tokens -> windows -> horizon and margin, and the validation prefix-collision check."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLLISION_K = 64  # tokens compared at the start of each window
COLLISION_AUTO_BYTES = 2 << 30  # data-info checks collisions by itself up to this much token data
CHUNK = 1 << 20  # training windows hashed per numpy pass
_P = np.uint64(0x100000001B3)


@dataclass(frozen=True)
class Geometry:
    total_tokens: int
    seq_len: int
    n_windows: int
    n_train: int
    n_val: int
    steps: int
    tokens_per_step: int

    @classmethod
    def of(cls, total_tokens: int, seq_len: int, val_windows: int, steps: int, tokens_per_step: int) -> Geometry:
        # Window i holds tokens [i*L, i*L + L] (L + 1 of them: the labels are the next tokens).
        n_windows = max(0, (total_tokens - 1) // seq_len)
        return cls(total_tokens, seq_len, n_windows, n_windows - val_windows, val_windows, steps, tokens_per_step)

    @property
    def horizon(self) -> int:
        return self.steps * self.tokens_per_step

    @property
    def train_tokens(self) -> int:
        """Tokens one pass over the training windows provides."""
        return self.n_train * self.seq_len

    @property
    def epochs(self) -> float:
        return self.horizon / self.train_tokens if self.train_tokens > 0 else float("inf")

    @property
    def margin(self) -> float:
        """How much one pass exceeds the horizon, as a fraction of the horizon (negative: it falls short)."""
        return (self.train_tokens - self.horizon) / self.horizon if self.horizon else float("inf")

    def lines(self) -> list[str]:
        out = [
            f"{self.total_tokens:,} tokens → {self.n_windows:,} windows of {self.seq_len:,} "
            f"({self.n_train:,} train, {self.n_val:,} validation)",
            f"horizon {self.steps:,} × {self.tokens_per_step:,} = {self.horizon:,} tokens; "
            f"{self.margin * 100:.1f} % margin",
        ]
        if self.epochs > 1:
            out.append(f"the horizon is {self.epochs:.2f} passes over the training windows: epoch e >= 1 reads "
                       "them in a new order, the permutation keyed by (shuffle_seed, e)")
        return out


def _hash_rows(rows: np.ndarray) -> np.ndarray:
    h = np.zeros(rows.shape[0], dtype=np.uint64)
    for j in range(rows.shape[1]):
        h = h * _P + rows[:, j].astype(np.uint64)
    return h


def prefix_collisions(ds, k: int = COLLISION_K) -> int:
    """How many validation windows start with the same k tokens as some training window.

    Every training window's first k tokens are hashed straight from the memory-mapped shards (a strided
    view, no copy of the windows); a hash hit is confirmed by comparing the tokens, so the count is exact.
    """
    L = ds.seq_len
    k = min(k, L)
    stream = ds.stream
    val_ids = ds.val_window_ids()
    if not val_ids.size:
        return 0
    val_rows = np.stack([stream.read(int(i) * L, k) for i in val_ids])
    val = {row.tobytes() for row in val_rows}
    val_hashes = np.unique(_hash_rows(val_rows))
    seen: set[bytes] = set()

    def scan(rows: np.ndarray) -> None:
        for r in np.flatnonzero(np.isin(_hash_rows(rows), val_hashes)):
            if (key := rows[r].tobytes()) in val:
                seen.add(key)

    spans = []
    for s, arr in enumerate(stream.shards):
        lo, hi = int(stream.offsets[s]), int(stream.offsets[s + 1])
        first = -(-lo // L)  # windows starting inside this shard whose first k tokens stay inside it
        last = min((hi - k) // L, ds.n_train - 1)
        if last < first:
            continue
        spans.append((first, last))
        base = arr[first * L - lo :]
        for a in range(0, last - first + 1, CHUNK):
            count = min(CHUNK, last - first + 1 - a)
            step = (L * arr.itemsize, arr.itemsize)
            scan(np.lib.stride_tricks.as_strided(base[a * L :], shape=(count, k), strides=step, writeable=False))
    # The few windows whose first k tokens cross a shard boundary.
    gaps: list[int] = []
    expected = 0
    for first, last in spans:
        gaps += range(expected, first)
        expected = last + 1
    gaps += range(expected, ds.n_train)
    if gaps:
        scan(np.stack([stream.read(i * L, k) for i in gaps]))
    return sum(1 for row in val_rows if row.tobytes() in seen)
