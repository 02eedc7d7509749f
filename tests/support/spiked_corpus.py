"""A prepared test corpus with garbage written over the windows at chosen positions of the training order."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from baton.data.manifest import MANIFEST, corpus_fingerprint
from baton.data.reader import WindowDataset
from baton.data.shards import open_shard, write_shard


def spiked_corpus(src: Path, dst: Path, positions: range, seq_len: int, shuffle_seed: int, val_windows: int,
                  seed: int = 0) -> list[int]:
    """Copy ``src`` to ``dst`` and fill the training windows at stream ``positions`` with uniformly random
    token ids (a distribution shift no text has); the shard hashes and the fingerprint are rewritten, so the
    folder is a consistent prepared corpus. Returns the window ids written."""
    shutil.copytree(src, dst)
    ds = WindowDataset(dst, seq_len, shuffle_seed, val_windows)
    ids = ds.train_window_ids(positions.start, len(positions)).tolist()
    manifest = ds.manifest
    vocab = manifest["tokenizer"]["vocab_size"]
    shards = [np.array(open_shard(dst / s["file"])) for s in manifest["shards"]]
    offsets = np.cumsum([0] + [a.size for a in shards])
    rng = np.random.default_rng(seed)
    for w in ids:
        for t in range(w * seq_len, w * seq_len + seq_len):  # the window's inputs; the next window is untouched
            k = int(np.searchsorted(offsets, t, side="right")) - 1
            shards[k][t - offsets[k]] = rng.integers(1, vocab)
    del ds
    for arr, s in zip(shards, manifest["shards"]):
        s["sha256"] = write_shard(dst / s["file"], arr)
    manifest["fingerprint"] = corpus_fingerprint(manifest["shards"], manifest["tokenizer"]["sha256"], manifest["dtype"])
    (dst / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return ids
