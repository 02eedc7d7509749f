"""Decontamination: drop training documents that share a long token n-gram with an evaluation text.

N-grams are over token ids of the prepare tokenizer (a 13-token n-gram is roughly 8-10 words of English).
Every n-gram of every evaluation text is hashed to 64 bits; a training document's n-gram hashes are
looked up in the sorted table, and a hit is confirmed by comparing the tokens themselves, so a hash
collision never drops a document.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..hashing import sha256_file
from .sources import expand

log = logging.getLogger(__name__)

_P = np.uint64(0x100000001B3)  # FNV prime: odd, so the polynomial hash mixes every position


def ngram_hashes(ids: np.ndarray, n: int) -> np.ndarray:
    """Polynomial hash (mod 2^64) of every length-n window of ``ids``; empty when len(ids) < n."""
    m = ids.size - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64)
    x = ids.astype(np.uint64) + np.uint64(1)
    h = np.zeros(m, dtype=np.uint64)
    for j in range(n):
        h = h * _P + x[j : j + m]
    return h


def eval_files(patterns: list[str]) -> list[Path]:
    files: list[Path] = []
    for pat in patterns:
        found = expand(pat)
        if not found:
            raise DataError(f"data.decontaminate: {pat!r} matches no files (give evaluation text files or globs)")
        files += found
    return files


def check_lengths(files: list[Path], texts: list[np.ndarray], n: int) -> None:
    """An evaluation text shorter than ``n`` tokens has no n-gram, so nothing is ever dropped for it: said, and
    refused when that is every text (decontamination would do nothing at all)."""
    short = [f"{f} ({t.size} tokens)" for f, t in zip(files, texts) if t.size < n]
    if not short:
        return
    if len(short) == len(texts):
        raise DataError(f"data.decontaminate: every evaluation text is shorter than data.decontam_ngram={n} tokens "
                        f"({', '.join(short[:3])}), so none could match a training document; lower "
                        f"data.decontam_ngram to at most {max(1, max(t.size for t in texts))} or give longer texts")
    log.warning("data.decontaminate: %d of %d evaluation texts are shorter than data.decontam_ngram=%d tokens and "
                "can match no training document: %s%s", len(short), len(texts), n, ", ".join(short[:5]),
                " ..." if len(short) > 5 else "")


def describe(patterns: list[str]) -> list[dict[str, str]]:
    """Identity of the evaluation texts (for the prepare spec and the manifest)."""
    return [{"path": str(f), "sha256": sha256_file(f)} for f in eval_files(patterns)]


class Decontaminator:
    """Built once from the evaluation token arrays; ``hit(ids)`` is cheap and exact."""

    def __init__(self, texts: list[np.ndarray], n: int):
        self.n = n
        self.texts = [np.asarray(t, dtype=np.int64) for t in texts]
        hashes, where_text, where_pos = [], [], []
        for ti, t in enumerate(self.texts):
            h = ngram_hashes(t, n)
            hashes.append(h)
            where_text.append(np.full(h.size, ti, dtype=np.int64))
            where_pos.append(np.arange(h.size, dtype=np.int64))
        h = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
        order = np.argsort(h, kind="stable")
        self.hashes = h[order]
        self.where_text = (np.concatenate(where_text) if where_text else np.zeros(0, np.int64))[order]
        self.where_pos = (np.concatenate(where_pos) if where_pos else np.zeros(0, np.int64))[order]

    @property
    def n_ngrams(self) -> int:
        return int(np.unique(self.hashes).size)

    def hit(self, ids: np.ndarray) -> bool:
        if not self.hashes.size:
            return False
        h = ngram_hashes(ids, self.n)
        if not h.size:
            return False
        lo = np.searchsorted(self.hashes, h, side="left")
        found = lo < self.hashes.size
        found[found] = self.hashes[lo[found]] == h[found]
        ids64 = np.asarray(ids, dtype=np.int64)
        for doc_pos in np.flatnonzero(found):
            k = int(lo[doc_pos])
            while k < self.hashes.size and self.hashes[k] == h[doc_pos]:
                t, p = self.texts[self.where_text[k]], int(self.where_pos[k])
                if np.array_equal(t[p : p + self.n], ids64[doc_pos : doc_pos + self.n]):
                    return True
                k += 1
        return False
