"""Windows over the prepared token stream, in a seeded global order, addressed by sample number.

The stream (all shards concatenated) is cut into non-overlapping windows of ``seq_len`` tokens; window i
covers tokens [i*L, i*L + L] (L+1 tokens, so labels are the next tokens). The last ``val_windows``
windows are held out for validation. Training sample s (counted globally over the whole run) is window
``perm_e[s mod n_train]`` of epoch e = s div n_train. Resuming at sample s therefore *slices* the order at
s: there is no iteration over earlier samples and no state other than the counter.

A run may skip ranges of that order (a loss-spike rollback skips the samples that produced the spike):
``skipped`` holds half-open ranges of *stream* positions, and training sample s is then the s-th
position of the stream that is not skipped. The ranges are part of the cursor, so the position stays
arithmetic: a counter plus a short list.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DataError, ResumeError
from .manifest import load_manifest
from .permutation import Permutation
from .shards import open_shard

if TYPE_CHECKING:  # torch is imported where tensors are made: data-info and verify stay light
    import torch

# Window ids are computed this many samples at a time: one vectorised permutation evaluation then serves
# many steps, instead of a few dozen small numpy calls per micro-batch.
ID_BLOCK = 4096


@dataclass(frozen=True)
class Cursor:
    """The whole data state of a run: a counter plus the identities that make the counter meaningful."""

    samples_consumed: int
    step: int
    seq_len: int
    shuffle_seed: int
    dataset_fingerprint: str
    permutation_fingerprint: str
    skipped: tuple[tuple[int, int], ...] = ()  # stream ranges [start, end) the run skips, sorted and disjoint

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"skipped": [list(r) for r in self.skipped]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cursor:
        try:
            fields = {k: d[k] for k in cls.__dataclass_fields__ if k != "skipped"}
            # A cursor written before ranges could be skipped has none.
            skipped = tuple((int(a), int(b)) for a, b in d.get("skipped") or ())
            problem = skipped_problem(skipped)
            if problem:
                raise ValueError(problem)
            return cls(**fields, skipped=skipped)
        except (KeyError, TypeError, ValueError) as e:
            raise ResumeError(f"checkpoint cursor is malformed ({e}): {d!r}") from None


def skipped_problem(ranges: tuple[tuple[int, int], ...]) -> str | None:
    """What is wrong with a list of skipped ranges (None: non-empty, sorted, disjoint, not negative)."""
    last = 0
    for a, b in ranges:
        if not 0 <= a < b or a < last:
            return f"skipped range [{a}, {b}) is empty, negative or overlaps the one before it"
        last = b
    return None


def merge_range(ranges: tuple[tuple[int, int], ...], new: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    """``ranges`` with ``new`` added, overlapping or touching ranges joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted([*ranges, new]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


def stream_positions(samples: np.ndarray, skipped: tuple[tuple[int, int], ...]) -> np.ndarray:
    """The stream position of each training sample number, stepping over the skipped ranges."""
    pos = samples
    for a, b in skipped:  # ascending: each shift can only carry a position past later ranges
        pos = np.where(pos >= a, pos + (b - a), pos)
    return pos


class TokenStream:
    """All shards as one read-only token sequence (memory-mapped; nothing is loaded eagerly)."""

    def __init__(self, data_dir: Path, manifest: dict[str, Any]):
        self.shards = [open_shard(data_dir / s["file"]) for s in manifest["shards"]]
        for arr, s in zip(self.shards, manifest["shards"]):
            if arr.size != s["tokens"]:
                raise DataError(f"{s['file']} holds {arr.size} tokens, manifest says {s['tokens']} (rerun prepare)")
        self.offsets = np.cumsum([0] + [a.size for a in self.shards])
        self.total = int(self.offsets[-1])

    def read(self, start: int, length: int) -> np.ndarray:
        end = start + length
        if start < 0 or end > self.total:
            raise IndexError(f"token range [{start}, {end}) outside the stream of {self.total}")
        i = int(np.searchsorted(self.offsets, start, side="right")) - 1
        parts = []
        while start < end:
            lo = start - int(self.offsets[i])
            take = min(end - start, self.shards[i].size - lo)
            parts.append(self.shards[i][lo : lo + take])
            start += take
            i += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


class WindowDataset:
    def __init__(self, data_dir: str | Path, seq_len: int, shuffle_seed: int, val_windows: int):
        self.data_dir = Path(data_dir)
        self.manifest = load_manifest(self.data_dir)
        self.stream = TokenStream(self.data_dir, self.manifest)
        self.seq_len = seq_len
        self.shuffle_seed = shuffle_seed
        self.n_windows = (self.stream.total - 1) // seq_len
        self.n_val = val_windows
        self.n_train = self.train_windows(self.stream.total, seq_len, val_windows)
        if self.n_train < 1:
            raise DataError(
                f"data.seq_len={seq_len} is too long for the corpus in {self.data_dir}: "
                f"{self.stream.total:,} tokens give {self.n_windows} windows, and {self.n_val} are held out "
                "for validation (lower seq_len or val_windows, or prepare more data)"
            )
        self.fingerprint: str = self.manifest["fingerprint"]
        self.vocab_size: int = self.manifest["tokenizer"]["vocab_size"]
        self._perms: dict[int, Permutation] = {}
        self.permutation_fingerprint = self._perm(0).fingerprint()
        # A corpus of one shard (a small run's): every window is a row of one strided view of it, so a read of
        # many windows is one gather instead of a slice and a copy per window.
        one = self.stream.shards[0] if len(self.stream.shards) == 1 else None
        self._one = None if one is None else np.lib.stride_tricks.as_strided(
            one, shape=(self.n_windows, seq_len + 1), strides=(seq_len * one.itemsize, one.itemsize), writeable=False)
        self._id_block: tuple[int, np.ndarray] | None = None  # (first sample, window ids from there)
        self._last_start: int | None = None  # the last sample a block miss started at
        self.skipped: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def train_windows(total_tokens: int, seq_len: int, val_windows: int) -> int:
        """Training windows of a corpus of ``total_tokens``: every seq_len + 1 token window but the held-out."""
        return (total_tokens - 1) // seq_len - val_windows

    def set_skipped(self, ranges: tuple[tuple[int, int], ...]) -> None:
        """Skip these stream ranges from now on (the cursor's ``skipped``)."""
        self.skipped = tuple(ranges)
        self._id_block, self._last_start = None, None

    def stream_position(self, sample: int) -> int:
        return int(stream_positions(np.array([sample], dtype=np.int64), self.skipped)[0])

    def _perm(self, epoch: int) -> Permutation:
        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.clear()
            self._perms[epoch] = Permutation(self.n_train, self.shuffle_seed, epoch)
        return self._perms[epoch]

    # ---- addressing
    def train_window_ids(self, start_sample: int, count: int) -> np.ndarray:
        if self.skipped:
            return self._ids_at(stream_positions(np.arange(start_sample, start_sample + count, dtype=np.int64),
                                                 self.skipped))
        e, first = divmod(start_sample, self.n_train)
        if first + count <= self.n_train:  # within one epoch: the common case, one call
            return self._perm(e).take(np.arange(first, first + count, dtype=np.int64))
        return self._ids_at(np.arange(start_sample, start_sample + count, dtype=np.int64))

    def _ids_at(self, s: np.ndarray) -> np.ndarray:
        """The window at each stream position in ``s``."""
        epochs, pos = np.divmod(s, self.n_train)
        out = np.empty_like(s)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._perm(int(e)).take(pos[sel])
        return out

    def val_window_ids(self) -> np.ndarray:
        return np.arange(self.n_train, self.n_windows, dtype=np.int64)

    def windows(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.rows(ids)
        return t[:, :-1], t[:, 1:]

    def rows(self, ids: np.ndarray) -> torch.Tensor:
        """The ``seq_len + 1`` tokens of each window in ``ids`` as one int64 tensor.

        One slice per window, copied (and widened) straight into the int64 result: with the shards as plain
        arrays over their memory maps, this beats a fancy-index gather, which builds an index array of
        every token first (benchmarks/bench_reader.py measures both against bare numpy).
        """
        L = self.seq_len
        if self._one is not None:
            out = self._one[np.asarray(ids, dtype=np.int64)].astype(np.int64)
        else:
            starts = np.asarray(ids, dtype=np.int64) * L
            out = np.empty((len(starts), L + 1), dtype=np.int64)
            offsets, shards = self.stream.offsets, self.stream.shards
            shard = np.searchsorted(offsets, starts, side="right") - 1
            local = starts - offsets[shard]
            for j, (k, lo) in enumerate(zip(shard.tolist(), local.tolist())):
                a = shards[k]
                if lo + L + 1 <= a.size:
                    out[j] = a[lo : lo + L + 1]
                else:  # the rare window across a shard join
                    out[j] = self.stream.read(int(starts[j]), L + 1)
        # A token the model has no embedding for would end the session in an index error deep in the model:
        # said here, in one line (shards that match their manifest but were not written with this tokenizer).
        if out.size and int(out.max()) >= self.vocab_size:
            j = int(np.argmax(out.max(axis=1) >= self.vocab_size))
            raise DataError(f"window {int(ids[j])} of {self.data_dir} holds token id {int(out[j].max())}, outside "
                            f"the tokenizer's {self.vocab_size} tokens: the shards were not written with this "
                            "tokenizer (rerun `baton prepare`)")
        import torch

        return torch.from_numpy(out)

    def train_batch(self, start_sample: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.windows(self._block_ids(start_sample, count))

    def rank_rows(self, step: int, global_batch: int, rank: int, world: int) -> torch.Tensor:
        """This rank's share of optimizer step ``step``: a contiguous slice of the global batch, as whole
        windows (inputs and labels in one ``(global_batch // world, seq_len + 1)`` tensor), so a GPU gets the
        share in one copy and slices the micro-batches there (``micro_batches``).

        Every rank slices the same global order, so the samples of a step do not depend on the world size.
        """
        per_rank = global_batch // world
        return self.rows(self._block_ids(step * global_batch + rank * per_rank, per_rank))

    def rank_rows_ahead(self, step: int, steps: int, global_batch: int, rank: int, world: int) -> torch.Tensor:
        """``rank_rows`` of ``steps`` steps from ``step`` on, one after the other in one tensor, read in one go:
        step ``step + i``'s share is rows ``[i * per_rank, (i + 1) * per_rank)``. The vocabulary check covers
        every row read (a DataError names the first bad window, whichever step reads it)."""
        per_rank = global_batch // world
        ids = self._block_ids(step * global_batch, steps * global_batch)
        if world > 1:
            ids = ids.reshape(steps, global_batch)[:, rank * per_rank:(rank + 1) * per_rank].reshape(-1)
        return self.rows(ids)

    def _block_ids(self, start: int, count: int) -> np.ndarray:
        """``train_window_ids(start, count)``; reading forward, as training does, is served from a block of
        ``ID_BLOCK`` samples computed ahead. A jump (a resume, random access) computes just what it asks."""
        b = self._id_block
        if b is not None and b[0] <= start and start + count <= b[0] + len(b[1]):
            return b[1][start - b[0] : start - b[0] + count]
        last, self._last_start = self._last_start, start
        if count >= ID_BLOCK or last is None or not 0 < start - last <= ID_BLOCK:
            return self.train_window_ids(start, count)
        b = self._id_block = (start, self.train_window_ids(start, ID_BLOCK))
        return b[1][:count]

    # ---- the cursor
    def cursor(self, samples_consumed: int, step: int) -> Cursor:
        return Cursor(samples_consumed, step, self.seq_len, self.shuffle_seed, self.fingerprint,
                      self.permutation_fingerprint, self.skipped)

    def check_cursor(self, c: Cursor) -> None:
        """Refuse to resume a cursor that would mean different samples here (lists every difference)."""
        mine = self.cursor(c.samples_consumed, c.step)
        diffs = [
            f"{k}: checkpoint {getattr(c, k)!r}, now {getattr(mine, k)!r}"
            for k in ("seq_len", "shuffle_seed", "dataset_fingerprint", "permutation_fingerprint")
            if getattr(c, k) != getattr(mine, k)
        ]
        if diffs:
            raise ResumeError(
                "the checkpoint's data position does not apply to this data (" + "; ".join(diffs) + "); "
                "resume with the data and settings it was trained on, or start a new run.name"
            )


def micro_batches(rows: torch.Tensor, micro_batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, labels) of each micro-batch of a rank's share (``WindowDataset.rank_rows``). On the host each
    is contiguous: the share's inputs and labels are copied apart once, in numpy, so the model does not copy a
    strided view of every micro-batch again (an embedding and a cross-entropy take them flat). On a GPU they
    are views of the one copy there."""
    import torch

    if rows.device.type != "cpu":
        for j in range(0, len(rows), micro_batch):
            yield rows[j : j + micro_batch, :-1], rows[j : j + micro_batch, 1:]
        return
    r = rows.numpy()
    x, y = np.ascontiguousarray(r[:, :-1]), np.ascontiguousarray(r[:, 1:])
    for j in range(0, len(r), micro_batch):
        yield torch.from_numpy(x[j : j + micro_batch]), torch.from_numpy(y[j : j + micro_batch])


def prefix_collisions(ds: WindowDataset, k: int = 64) -> int:
    """How many validation windows start with the same k tokens as some training window (exact)."""
    from .geometry import prefix_collisions as count

    return count(ds, k)
