"""Windows over the prepared token stream, in a seeded global order, addressed by sample number.

The stream (all shards concatenated) is cut into non-overlapping windows of ``seq_len`` tokens; window i
covers tokens [i*L, i*L + L] (L+1 tokens, so labels are the next tokens). The last ``val_windows``
windows are held out for validation. Training sample s (counted globally over the whole run) is window
``perm_e[s mod n_train]`` of epoch e = s div n_train. Resuming at sample s therefore *slices* the order at
s: there is no iteration over earlier samples and no state other than the counter.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import DataError, ResumeError
from .manifest import load_manifest
from .permutation import Permutation
from .shards import open_shard


@dataclass(frozen=True)
class Cursor:
    """The whole data state of a run: a counter plus the identities that make the counter meaningful."""

    samples_consumed: int
    step: int
    seq_len: int
    shuffle_seed: int
    dataset_fingerprint: str
    permutation_fingerprint: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cursor:
        try:
            return cls(**{k: d[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError) as e:
            raise ResumeError(f"checkpoint cursor is malformed ({e}): {d!r}") from None


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
        self.n_train = self.n_windows - self.n_val
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

    def _perm(self, epoch: int) -> Permutation:
        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.clear()
            self._perms[epoch] = Permutation(self.n_train, self.shuffle_seed, epoch)
        return self._perms[epoch]

    # ---- addressing
    def train_window_ids(self, start_sample: int, count: int) -> np.ndarray:
        s = np.arange(start_sample, start_sample + count, dtype=np.int64)
        epochs, pos = np.divmod(s, self.n_train)
        out = np.empty_like(s)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._perm(int(e)).take(pos[sel])
        return out

    def val_window_ids(self) -> np.ndarray:
        return np.arange(self.n_train, self.n_windows, dtype=np.int64)

    def windows(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        L = self.seq_len
        rows = np.stack([self.stream.read(int(i) * L, L + 1) for i in ids]).astype(np.int64)
        t = torch.from_numpy(rows)
        return t[:, :-1], t[:, 1:]

    def train_batch(self, start_sample: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.windows(self.train_window_ids(start_sample, count))

    def rank_micro_batches(self, step: int, global_batch: int, micro_batch: int, rank: int, world: int):
        """This rank's micro-batches of optimizer step ``step``: its contiguous share of the global batch.

        Every rank slices the same global order, so the samples of a step do not depend on the world size.
        """
        per_rank = global_batch // world
        base = step * global_batch + rank * per_rank
        for j in range(0, per_rank, micro_batch):
            yield self.train_batch(base + j, micro_batch)

    # ---- the cursor
    def cursor(self, samples_consumed: int, step: int) -> Cursor:
        return Cursor(samples_consumed, step, self.seq_len, self.shuffle_seed, self.fingerprint,
                      self.permutation_fingerprint)

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


def prefix_collisions(ds: WindowDataset, k: int = 64) -> int:
    """How many validation windows start with the same k tokens as some training window."""
    L = ds.seq_len
    k = min(k, L)
    seen = set()
    for i in range(ds.n_train):
        seen.add(hashlib.blake2b(ds.stream.read(i * L, k).tobytes(), digest_size=16).digest())
    return sum(
        hashlib.blake2b(ds.stream.read(int(i) * L, k).tobytes(), digest_size=16).digest() in seen
        for i in ds.val_window_ids()
    )
