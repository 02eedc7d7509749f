"""sha256 of files and bytes, streamed so a multi-GB checkpoint never sits in memory."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 8 << 20


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
