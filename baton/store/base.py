"""The storage protocol: the few operations the checkpoint cycle needs, and nothing else.

Keys are relative '/'-separated paths below the store's root (``<run>/ckpt/step-8/model.safetensors``).
Every backend must report sizes and sha256 from what it *holds*, and answer ranged reads with the
range it actually served, so the verifier can catch a short, shifted or whole-object answer.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from .. import faults
from ..errors import LocalDiskError, StoreError


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    sha256: str | None  # None when the store holds no checksum for the object
    source: str = ""  # where the sha256 came from (rehashed bytes, object metadata, a service checksum)


@dataclass(frozen=True)
class RangeRead:
    """A ranged read as served: ``status`` 206 and ``content_range`` 'bytes a-b/size' when honoured."""

    data: bytes
    status: int
    content_range: str | None


@dataclass(frozen=True)
class Versioned:
    """A small text object with the token a conditional write names (``Store.write_if``).

    ``version`` is opaque: a content hash (local), an ETag (S3), a commit (the Hub). ``age`` is the seconds
    since the object was last written as the store's own clock tells it (the file server's stamps, S3's
    Last-Modified against its Date), or None when the store cannot tell it cheaply (the Hub): expiry is then
    judged by watching for a renewal, never by comparing two machines' clocks."""

    text: str
    version: str
    age: float | None = None


# Two stamps of one clock at a second's resolution can read a second or so apart the wrong way round.
CLOCK_SLACK_S = 2.0


def store_age(now: float, stamp: float) -> float | None:
    """An object's age from two readings of the store's own clock (its stamp, and now). A stamp in the future
    (the clock stepped back, or a store copied with its timestamps by ``cp -p`` or ``rsync -t``) tells no age:
    None, so expiry is judged by watching for a renewal, as where the store has no clock, never by an age
    that would hold the object young for as long as the skew lasts."""
    age = now - stamp
    if age < -CLOCK_SLACK_S:
        return None
    return max(0.0, age)


@runtime_checkable
class Store(Protocol):
    def describe(self) -> str:
        """Where this store is, safe to print (no credentials)."""

    def put_file(self, local: Path, key: str, sha256: str, create: bool = False) -> str:
        """Upload ``local`` to ``key``; ``sha256`` is stored with it where the backend keeps metadata.

        Returns the sha256 of the bytes sent. A backend with ``hashes_on_write = True`` computes it while it
        writes and accepts ``sha256=None``, so the cycle need not read the file a second time. ``create``: only
        if ``key`` does not exist yet (a checkpoint's files: one writer never overwrites another's); other bytes
        there raise WriteConflict, the same bytes (a retried upload that had landed) count as written. The Hub
        fences every commit instead (``HubStore.fence``)."""

    def list(self, prefix: str, checksums: bool = True) -> dict[str, ObjectInfo]:
        """Objects under ``prefix`` with their size and sha256 as the store reports them.

        ``checksums=False`` may leave sha256 as None: for callers that need only keys (retention), since
        some backends pay a request or a rehash per object for the checksum.
        """

    def read_range(self, key: str, start: int, end: int) -> RangeRead:
        """Bytes ``start..end`` inclusive, as the store served them."""

    def get_file(self, key: str, local: Path) -> None:
        """Download ``key`` to ``local``."""

    def delete(self, key: str) -> None:
        """Remove one object; removing an absent object is not an error."""

    def read_text(self, key: str) -> str | None:
        """A small text object, or None when it does not exist (any other failure raises)."""

    def write_text(self, key: str, text: str) -> None:
        """Write a small text object in one piece."""

    def read_versioned(self, key: str) -> Versioned | None:
        """A small text object with its version (and age), or None when it does not exist."""

    def write_if(self, key: str, text: str, version: str | None) -> str:
        """Write ``text`` only if ``key`` is still at ``version`` (None: only if it does not exist); returns the
        new version. Raises WriteConflict when another write got there first. A write whose answer was lost
        and that is retried finds its own bytes there: that counts as done, not as a conflict."""


def safe_key(key: str) -> str:
    """Refuse keys that could escape the store root (absolute, '..', empty parts)."""
    if not key or key.startswith("/") or "\\" in key:
        raise StoreError(f"refusing store key {key!r}: keys are relative '/' paths")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts[:-1]) or parts[-1] in (".", ".."):
        raise StoreError(f"refusing store key {key!r}: it contains '.', '..' or an empty part")
    return key


def put_files(store: Store, items: list[tuple[Path, str, str]], create: bool = False) -> None:
    """Upload (local, key, sha256) items; one commit where the backend has commits (the Hub). ``create``: as
    in ``Store.put_file``."""
    batch = getattr(store, "put_files", None)
    if batch is not None:
        batch(items)
        return
    for local, key, sha in items:
        faults.point("upload")
        store.put_file(local, key, sha, create=create)


def delete_keys(store: Store, keys: list[str]) -> None:
    """Delete several objects; one commit where the backend has commits."""
    batch = getattr(store, "delete_many", None)
    if batch is not None:
        batch(keys)
        return
    for key in keys:
        store.delete(key)


def delete_prefix(store: Store, prefix: str) -> None:
    delete_keys(store, sorted(store.list(prefix, checksums=False)))


def decode_text(data: bytes | None, key: str, where: str) -> str | None:
    """A text object's bytes as ``read_text`` returns them: None stays None (no such object)."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StoreError(f"{key} in {where} is not UTF-8 text ({e.reason} at byte {e.start})") from None


@contextmanager
def _this_disk(local: Path) -> Iterator[None]:
    """An OSError in here is about our own disk: it must not be retried or blamed on the store."""
    try:
        yield
    except OSError as e:
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        what = "no space left" if full else (e.strerror or str(e))
        fix = "free space there or set run.local_dir to a larger disk" if full else "check that it is writable"
        raise LocalDiskError(f"{what} on this machine's disk writing {local} ({fix}, then rerun)") from None


def write_download(local: Path, chunks: Iterable[bytes]) -> None:
    """Write a download to ``local`` through a '.partial' sibling, so a cut transfer never leaves a file that
    looks whole. Errors from ``chunks`` (the network, the store's disk) propagate untouched for the backend's
    retry loop to classify; errors writing here raise LocalDiskError, which no retry can cure."""
    tmp = local.with_name(local.name + ".partial")
    try:
        with _this_disk(local):
            local.parent.mkdir(parents=True, exist_ok=True)
            f = open(tmp, "wb")
        try:
            for chunk in chunks:
                with _this_disk(local):
                    f.write(chunk)
        finally:
            with _this_disk(local):
                f.close()  # flushes the buffer: a full disk can first show here
        with _this_disk(local):
            os.replace(tmp, local)
    finally:
        tmp.unlink(missing_ok=True)
