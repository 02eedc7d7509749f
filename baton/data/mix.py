"""The mix: every source's documents, repeated by weight, interleaved in proportion to size.

Sources are not concatenated one after another: the held-out validation windows come from the end of the
token stream, and they should look like the whole mix, not like its last source. The next document is
always taken from the source that has used the smallest share of its estimated size (ties: the lower
index), a merge that depends only on the documents, so the result is the same on every machine and rerun.

Dropping a source early (its ``max_tokens`` is reached) does not change the order of the others: their
relative order in the merge never depended on it. That is what lets the prepare loop stop reading a capped
source as soon as it learns of the cap, however many batches are in flight, and still write the same bytes.

A weight w repeats the source: floor(w) full passes, then one pass keeping a seeded share (w - floor(w)) of
its documents, chosen by a hash of (seed, source, document index).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from typing import Any

from .sources import Doc, SourceReader

BYTES_PER_TOKEN_GUESS = 4  # turns a max_tokens cap into a size estimate; only proportions matter


class SourceStream:
    """One source across its passes. State: [pass, position, document index, bytes used, documents per pass]."""

    def __init__(self, reader: SourceReader, seed: int, state: list[Any] | None = None):
        self.reader, self.seed = reader, seed
        src = reader.src
        self.full_passes = int(src.weight)
        self.frac = src.weight - self.full_passes
        self.n_passes = self.full_passes + (1 if self.frac > 0 else 0)
        self.max_bytes = src.max_bytes or math.inf
        self.state: list[Any] = list(state) if state else [0, reader.start(), 0, 0, None]
        self._it: Iterator[Doc] | None = None

    def snapshot(self) -> list[Any]:
        return [self.state[0], list(self.state[1]), *self.state[2:]]

    def _keep(self, doc_index: int) -> bool:
        if self.state[0] < self.full_passes:
            return True
        h = hashlib.sha256(f"{self.seed}|{self.reader.index}|{doc_index}".encode()).digest()
        return int.from_bytes(h[:8], "little") / 2**64 < self.frac

    def next(self) -> tuple[str, int] | None:
        """The next document and its size in the source, or None when every pass is done."""
        st = self.state
        while st[0] < self.n_passes:
            if self._it is None:
                self._it = self.reader.read(st[1])
            limit = st[4]
            if limit is not None and st[2] >= limit:
                item = None
            else:
                item = next(self._it, None)
                if item is not None and limit is None and st[3] + item[1] > self.max_bytes:
                    item = None  # max_bytes reached: this is where every pass ends
            if item is None:
                if st[4] is None:
                    st[4] = st[2]
                st[0], st[1], st[2] = st[0] + 1, self.reader.start(), 0
                self._it = None
                continue
            text, nbytes, nxt = item
            doc_index = st[2]
            st[1], st[2] = nxt, doc_index + 1
            if st[4] is None:
                st[3] += nbytes
            if self._keep(doc_index):
                return text, nbytes
        return None


class Mix:
    """Draws ``(source index, text, nbytes)`` in the interleaved order; its state is a small JSON value."""

    def __init__(self, readers: list[SourceReader], seed: int, state: dict[str, Any] | None = None):
        self.readers = readers
        self.est = [max(1, estimate(r)) for r in readers]
        st = state or {}
        saved = st.get("streams") or [None] * len(readers)
        self.streams = [SourceStream(r, seed, saved[i]) for i, r in enumerate(readers)]
        self.consumed = list(st.get("consumed", [0] * len(readers)))
        self.active = list(st.get("active", [True] * len(readers)))

    def snapshot(self) -> dict[str, Any]:
        return {"streams": [s.snapshot() for s in self.streams], "consumed": list(self.consumed),
                "active": list(self.active)}

    def deactivate(self, i: int) -> None:
        self.active[i] = False

    def draw(self) -> tuple[int, str, int] | None:
        while True:
            best, key = -1, math.inf
            for i, on in enumerate(self.active):
                if on and self.consumed[i] / self.est[i] < key:
                    best, key = i, self.consumed[i] / self.est[i]
            if best < 0:
                return None
            item = self.streams[best].next()
            if item is None:
                self.active[best] = False
                continue
            self.consumed[best] += item[1]
            return best, item[0], item[1]


def estimate(reader: SourceReader) -> int:
    """Expected bytes the source contributes to the mix: its size, capped, times its weight."""
    src = reader.src
    size = min(reader.est_bytes, src.max_bytes or math.inf)
    if src.max_tokens:
        size = min(size, src.max_tokens * BYTES_PER_TOKEN_GUESS)
    return int(size * src.weight)
