"""The shard file format: a 32-byte header, then the tokens as little-endian uint16 or uint32.

Header: magic ``BATONTOK`` (8 bytes), format version (u32), bytes per token (u32), token count (u64),
reserved (u64, zero). The header makes a truncated or foreign file fail loudly at open time instead of
feeding the model garbage tokens.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import DataError

MAGIC = b"BATONTOK"
VERSION = 1
HEADER = struct.Struct("<8sIIQQ")
HEADER_SIZE = HEADER.size  # 32


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def write_shard(path: Path, tokens: np.ndarray) -> str:
    """Write atomically (temp file + rename) and return the file's sha256."""
    tokens = np.ascontiguousarray(tokens)
    if tokens.dtype not in (np.uint16, np.uint32):
        raise ValueError(f"shard tokens must be uint16 or uint32, got {tokens.dtype}")
    header = HEADER.pack(MAGIC, VERSION, tokens.dtype.itemsize, tokens.size, 0)
    body = tokens.astype(tokens.dtype.newbyteorder("<"), copy=False).tobytes()
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    h = hashlib.sha256(header)
    h.update(body)
    return h.hexdigest()


def read_header(path: Path) -> tuple[np.dtype, int]:
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_SIZE)
    except FileNotFoundError:
        raise DataError(f"shard {path} is missing (rerun `baton prepare`)") from None
    except OSError as e:  # a folder where the shard should be, no permission, an I/O error
        raise DataError(f"shard {path} could not be read ({e.strerror or e}); rerun `baton prepare`") from None
    if len(raw) < HEADER_SIZE:
        raise DataError(f"shard {path} is truncated: {len(raw)} bytes, shorter than its header (rerun `baton prepare`)")
    magic, version, itemsize, count, _ = HEADER.unpack(raw)
    if magic != MAGIC:
        raise DataError(f"shard {path} is not a baton token shard (bad magic {magic!r})")
    if version != VERSION:
        raise DataError(f"shard {path} has format version {version}; this baton reads version {VERSION}")
    if itemsize not in (2, 4):
        raise DataError(f"shard {path} declares {itemsize} bytes per token; only 2 and 4 exist")
    expected = HEADER_SIZE + count * itemsize
    actual = path.stat().st_size
    if actual != expected:
        raise DataError(
            f"shard {path} is {actual} bytes but its header promises {expected} "
            f"({count} tokens): truncated or padded (rerun `baton prepare`)"
        )
    return np.dtype(np.uint16 if itemsize == 2 else np.uint32).newbyteorder("<"), count


def open_shard(path: Path) -> np.ndarray:
    """A shard's tokens as a read-only array over a memory map; the header is validated first.

    A plain ndarray, not an ``np.memmap``: slicing a memmap builds a memmap subclass each time, which
    costs more than copying a window's tokens.
    """
    dtype, count = read_header(path)
    if count == 0:
        return np.zeros(0, dtype=dtype)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # the map outlives the file handle
    return np.frombuffer(mm, dtype=dtype, count=count, offset=HEADER_SIZE)
