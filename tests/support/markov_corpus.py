"""A prepared test corpus whose tokens follow a Markov chain: a model learns it in a few dozen steps, then sits on
a plateau set by its learning rate, which a cooldown takes it below (the regime WSD's cooldown is for)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from baton.data.manifest import MANIFEST, corpus_fingerprint
from baton.data.shards import open_shard, write_shard


def markov_corpus(src: Path, dst: Path, symbols: int = 64, follow: float = 0.75, seed: int = 0) -> Path:
    """Copy the prepared corpus ``src`` to ``dst`` with every token rewritten: after token x comes its fixed
    successor with probability ``follow``, else one of ``symbols`` tokens at random. The tokenizer and the
    shard layout stay; the shard hashes and the fingerprint are rewritten, so ``dst`` is a consistent prepared
    corpus."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / MANIFEST).read_text(encoding="utf-8"))
    rng = np.random.default_rng(seed)
    successor = rng.permutation(symbols)
    x = 0
    for s in manifest["shards"]:
        old = np.array(open_shard(dst / s["file"]))
        keep, noise = rng.random(old.size) < follow, rng.integers(0, symbols, old.size)
        out = np.empty(old.size, dtype=old.dtype)
        for i in range(old.size):
            x = successor[x] if keep[i] else noise[i]
            out[i] = x + 1  # id 0 left out: the tokenizer's first id may be special
        s["sha256"] = write_shard(dst / s["file"], out)
    manifest["fingerprint"] = corpus_fingerprint(manifest["shards"], manifest["tokenizer"]["sha256"], manifest["dtype"])
    (dst / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return dst
