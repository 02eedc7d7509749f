"""On the CPU, a rank's shares of the next steps read, split into inputs and labels, and digested in one go.

Each step's share is the same either way (``WindowDataset.rank_rows`` of the step, the same digests): what
changes is when the host does the work. On a CPU the host is the device, and a small read, copy and hash per
step, done between the model's kernels with cold caches, cost several times what the same work costs done for
many steps at once (benchmarks/bench_step_overhead.py). On a GPU each step's share is still read on its own,
before its kernels are queued, and digested while they run; a block read there would stall the queue instead.

A window whose token is outside the vocabulary makes the block unreadable: the steps are then read one by one,
so the error names the step that reads the window, as it would without reading ahead.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch

from ..data.reader import WindowDataset
from ..errors import DataError

BLOCK_BYTES = 4 << 20  # the int64 rows of one block, at most (the inputs and labels copies are the same again)
MAX_STEPS = 64


class Share(NamedTuple):
    inputs: np.ndarray  # (per_rank, seq_len) int64, contiguous
    labels: np.ndarray
    digests: list[int]  # one per sample (``row_digests``)
    batch_sha: str | None  # the global batch's digest (``batch_digest``) where this rank's share is all of it


class ShareAhead:
    """This rank's shares of steps ``first`` to ``first + steps - 1``, read in one go (see the module)."""

    def __init__(self, global_batch: int, rank: int, world: int, seq_len: int):
        self.global_batch, self.rank, self.world = global_batch, rank, world
        self.per = global_batch // world
        self.steps = max(1, min(MAX_STEPS, BLOCK_BYTES // (self.per * (seq_len + 1) * 8)))
        self._key: tuple | None = None  # (the dataset, its skipped ranges, the first step) the block was read for
        self._block: tuple[np.ndarray, np.ndarray, list[int], list[str | None]] | None = None
        self._unreadable: tuple | None = None  # the key of a block that failed: its steps are read one by one

    def share(self, data: WindowDataset, step: int) -> Share | None:
        """Step ``step``'s share, or None where it must be read alone (a bad window ahead)."""
        key = self._key
        if key is None or not self._holds(key, data, step):
            self._key, self._block = None, None
            if self._unreadable is not None and self._holds(self._unreadable, data, step):
                return None  # not tried again for every step up to the bad window
            try:
                rows = data.rank_rows_ahead(step, self.steps, self.global_batch, self.rank, self.world).numpy()
            except DataError:  # read step by step: the error then comes from the step that reads the window
                self._unreadable = (data, data.skipped, step)
                return None
            digests = row_digests(rows)
            shas: list[str | None] = [None] * self.steps  # with several ranks, known after the step's collective
            if self.world == 1:
                shas = [batch_digest(digests[i:i + self.per]) for i in range(0, len(digests), self.per)]
            self._block = np.ascontiguousarray(rows[:, :-1]), np.ascontiguousarray(rows[:, 1:]), digests, shas
            self._key = (data, data.skipped, step)
            key = self._key
        assert self._block is not None
        n = step - key[2]
        i = n * self.per
        inputs, labels, digests, shas = self._block
        return Share(inputs[i:i + self.per], labels[i:i + self.per], digests[i:i + self.per], shas[n])


    def _holds(self, key: tuple, data: WindowDataset, step: int) -> bool:
        """Whether the block read for ``key`` holds ``step``'s share of ``data`` as it is now."""
        return key[0] is data and key[1] == data.skipped and key[2] <= step < key[2] + self.steps


def micro_batches(share: Share, micro_batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, labels) of each micro-batch of a share: views of the block's contiguous copies."""
    x, y = share.inputs, share.labels
    for j in range(0, len(x), micro_batch):
        yield torch.from_numpy(x[j:j + micro_batch]), torch.from_numpy(y[j:j + micro_batch])


def row_digests(rows: np.ndarray) -> list[int]:
    """Each sample's digest: 31 bits of blake2b over its input tokens as int64 (a sum of one such value per
    position is exact in the float64 all-reduce). ``rows``: the share as read, ``seq_len + 1`` tokens a row."""
    if not len(rows):
        return []
    whole = np.ascontiguousarray(rows).data.cast("B")
    step = whole.nbytes // len(rows)
    n = step - rows.itemsize  # the inputs: every token but the last
    blake = hashlib.blake2b
    return [int.from_bytes(blake(whole[i:i + n], digest_size=4).digest(), "little") >> 1
            for i in range(0, whole.nbytes, step)]


def batch_digest(digests: list[int]) -> str:
    """A global batch's ``batch_sha``: sha256 over its samples' digests in global-batch order, 16 hex digits."""
    return hashlib.sha256(struct.pack(f"{len(digests)}q", *digests)).hexdigest()[:16]
