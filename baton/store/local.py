"""A local directory as the store: the default, and the floor every remote backend is measured against.

What it lists as an object's sha256 is a statement about the bytes on disk, never about what we meant to
write. It hashes each file as it writes it (one read of the source, which is also how the checkpoint
cycle learns the file's sha256), stamps the file's mtime with the moment the write began and remembers
(size, inode, mtime, sha256). Listing reports that sha256 only while the file still has exactly that size,
inode and mtime; a file changed since (any write moves its mtime) or not written by this process is
rehashed. A store folder on a network mount can go away and come back (EIO, ESTALE, a vanished root);
those errors are retried like a dropped connection, anything else (a full disk, a read-only folder) stops
at once.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import os
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from ..errors import StoreError, WriteConflict
from ..hashing import sha256_file
from .base import ObjectInfo, RangeRead, Versioned, decode_text, safe_key, store_age, write_download
from .retry import RetryPolicy, Transient, call

# errno values a mount that is flapping or gone produces; everything else is a property of the folder.
TRANSIENT_ERRNOS = {errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.EAGAIN, errno.EBUSY, errno.ENOTCONN,
                    errno.EHOSTDOWN, errno.EHOSTUNREACH, errno.ECONNRESET, errno.ECONNABORTED}
# hashlib releases the GIL, so the files of a checkpoint hash in parallel, on at most half the cores: an
# asynchronous push must leave the training process its own.
HASH_THREADS = max(1, min(4, (os.cpu_count() or 2) // 2))
CHUNK = 8 << 20
LOCK_SUFFIX = ".lock"  # the sibling a conditional write locks (fcntl: released by the kernel if its process dies)
CLOCK_FILE = ".baton-clock"  # touched to read the store's clock (on a network mount: the file server's)
# fcntl locks belong to the process (and closing any descriptor of the file drops them): the threads of one
# process, whatever store object they hold, take turns here first.
_CAS = threading.Lock()


class LocalStore:
    def __init__(self, root: str | Path, retry: RetryPolicy | None = None):
        # Not resolved: a store reached through a symlink (a mount point) must keep following it.
        self.root = Path(os.path.abspath(Path(root).expanduser()))
        self.retry = retry or RetryPolicy()
        self._root_seen = self.root.is_dir()
        self._written: dict[str, tuple[int, int, int, str]] = {}  # key -> (size, inode, mtime_ns, sha256)
        self._lock = threading.Lock()

    # The cycle may take the sha256 from put_file instead of hashing the folder first.
    hashes_on_write = True

    def describe(self) -> str:
        return f"local store {self.root}"

    def _path(self, key: str) -> Path:
        return self.root / safe_key(key)

    def _call(self, fn, what: str):
        return call(fn, what, self.describe(), self._classify, self.retry)

    def _check_root(self) -> None:
        # A root that existed and vanished is a mount that went away: creating it afresh would write
        # the checkpoint onto the wrong disk, so it is reported (and retried) instead.
        if self.root.is_dir():
            self._root_seen = True
        elif self._root_seen:
            raise FileNotFoundError(errno.ENOENT, "the store folder disappeared (unmounted?)", str(self.root))

    def _classify(self, e: Exception) -> Exception:
        if isinstance(e, OSError) and (e.errno in TRANSIENT_ERRNOS or
                                       (e.errno == errno.ENOENT and self._root_seen and not self.root.is_dir())):
            return Transient(e.strerror or str(e))
        if isinstance(e, OSError):
            hint = " (the store's disk is full)" if e.errno == errno.ENOSPC else ""
            return StoreError(f"{e.strerror or e}{hint}")
        return e

    def put_file(self, local: Path, key: str, sha256: str | None = None, create: bool = False) -> str:
        """Copy ``local`` to ``key``, hashing the bytes as they are written; returns their sha256 (which
        may differ from ``sha256`` if the source changed since it was hashed: verification then fails).
        ``create``: a hard link of the finished copy makes it appear only where no file is (atomic on local
        and network file systems alike), so of two writers of one key only one lands its bytes."""
        dst = self._path(key)

        def put() -> str:
            self._check_root()
            with self._lock:
                self._written.pop(key, None)
            began = time.time_ns()
            h = hashlib.sha256()

            def copy(out: BinaryIO) -> None:
                with open(local, "rb") as src:
                    while chunk := src.read(CHUNK):
                        h.update(chunk)
                        out.write(chunk)

            judge = (lambda: _same_bytes(dst, h.hexdigest(), key, self.describe())) if create else None
            _write_atomically(dst, copy, create=judge)
            self._root_seen = True
            digest = h.hexdigest()
            self._remember(key, dst, began, digest)
            return digest

        return self._call(put, f"upload of {key}")

    def _remember(self, key: str, path: Path, stamp_ns: int, digest: str) -> None:
        # An mtime no later write can produce (a write stamps the coarse clock of its own, later, moment), so
        # an unchanged (size, inode, mtime) means unchanged bytes. Filesystems that round the stamp get no
        # record: their files are rehashed when listed.
        try:
            os.utime(path, ns=(stamp_ns, stamp_ns))
            st = path.stat()
        except OSError:
            return
        if st.st_mtime_ns == stamp_ns:
            with self._lock:
                self._written[key] = (st.st_size, st.st_ino, stamp_ns, digest)

    def _known_sha(self, key: str, path: Path) -> str | None:
        with self._lock:
            rec = self._written.get(key)
        if rec is None:
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        return rec[3] if (st.st_size, st.st_ino, st.st_mtime_ns) == rec[:3] else None

    def list(self, prefix: str, checksums: bool = True) -> dict[str, ObjectInfo]:
        def scan() -> list[tuple[str, Path, int]]:
            self._check_root()
            base = self.root / prefix if prefix else self.root
            # A prefix may end inside a name ("ckpt/step-1" lists "ckpt/step-10/..."); the root is its own folder.
            start = base if base.is_dir() or not prefix else base.parent
            if not start.is_dir():
                return []
            found = []
            for p in sorted(start.rglob("*")):
                if not p.is_file() or p.name.endswith((".partial", LOCK_SUFFIX)) or p.name == CLOCK_FILE:
                    continue
                key = p.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    found.append((key, p, p.stat().st_size))
            return found

        found = self._call(scan, f"listing of {prefix or '/'}")
        out: dict[str, ObjectInfo] = {}
        stale = []
        for key, path, size in found:
            sha = self._known_sha(key, path) if checksums else None
            out[key] = ObjectInfo(key, size, sha, "sha256 of the bytes as written here, file unchanged since" if sha
                                  else "")
            if checksums and sha is None:
                stale.append((key, path, size))
        if stale:
            with ThreadPoolExecutor(min(HASH_THREADS, len(stale))) as pool:
                shas = self._call(lambda: list(pool.map(sha256_file, [p for _, p, _ in stale])),
                                  f"hashing of {prefix or '/'}")
            for (key, _, size), sha in zip(stale, shas):
                out[key] = ObjectInfo(key, size, sha, "rehashed from the stored file")
        return out

    def read_range(self, key: str, start: int, end: int) -> RangeRead:
        p = self._path(key)

        def read() -> RangeRead:
            self._check_root()
            try:
                size = p.stat().st_size
                with open(p, "rb") as f:
                    f.seek(start)
                    data = f.read(end - start + 1)
            except FileNotFoundError:
                raise StoreError(f"{key} not found in {self.describe()}") from None
            last = start + len(data) - 1
            return RangeRead(data, 206, f"bytes {start}-{last}/{size}")

        return self._call(read, f"read of {key}")

    def get_file(self, key: str, local: Path) -> None:
        src = self._path(key)

        def get() -> None:
            self._check_root()
            if not src.is_file():
                raise StoreError(f"{key} not found in {self.describe()}")
            with open(src, "rb") as f:
                write_download(local, iter(lambda: f.read(CHUNK), b""))

        self._call(get, f"download of {key}")

    def delete(self, key: str) -> None:
        p = self._path(key)

        def delete() -> None:
            self._check_root()
            with self._lock:
                self._written.pop(key, None)
            p.unlink(missing_ok=True)
            # What a writer killed mid-copy left beside it (its own .partial, which its cleanup never reached): the
            # key is gone, and so is any claim to finish writing it.
            for left in p.parent.glob(f"{glob.escape(p.name)}.*.partial") if p.parent.is_dir() else ():
                left.unlink(missing_ok=True)
            # Tidy empty parent folders up to the root so deleted checkpoints leave no husks; a folder whose last
            # listed file went holds no more than such leftovers (of keys never finished), which go with it.
            for parent in p.parents:
                if parent == self.root or not parent.is_dir():
                    break
                rest = list(parent.iterdir())
                if any(not (q.is_file() and q.name.endswith(".partial")) for q in rest):
                    break
                for q in rest:
                    q.unlink(missing_ok=True)
                parent.rmdir()

        self._call(delete, f"delete of {key}")

    def read_text(self, key: str) -> str | None:
        p = self._path(key)

        def read() -> bytes | None:
            self._check_root()
            try:
                return p.read_bytes()
            except FileNotFoundError:
                return None

        return decode_text(self._call(read, f"read of {key}"), key, self.describe())

    def write_text(self, key: str, text: str) -> None:
        p = self._path(key)

        def write() -> None:
            self._check_root()
            _write_atomically(p, lambda f: f.write(text.encode("utf-8")))  # the old pointer or the new, never half
            self._root_seen = True

        self._call(write, f"write of {key}")

    # ------------------------------------------------------------------------ conditional writes
    @staticmethod
    def _clock(path: Path) -> float:
        """The store's clock now: the stamp its file system puts on a file touched now (the file server's own
        clock on a network mount), so an age compares two stamps of one clock. The file touched is the folder's
        clock file, next to ``path``, which listings skip. Never the lock sibling: closing any descriptor of a
        file drops every fcntl lock the process holds on it, so a read here would unlock another thread's
        compare-and-rename half-way."""
        p = path.with_name(CLOCK_FILE)
        with open(p, "a"):
            pass
        os.utime(p)
        return p.stat().st_mtime

    def read_versioned(self, key: str) -> Versioned | None:
        p = self._path(key)

        def read() -> Versioned | None:
            self._check_root()
            try:
                data = p.read_bytes()
                stamp = p.stat().st_mtime
            except FileNotFoundError:
                return None
            text = decode_text(data, key, self.describe())
            assert text is not None
            return Versioned(text, _digest(data), store_age(self._clock(p), stamp))

        return self._call(read, f"read of {key}")

    def write_if(self, key: str, text: str, version: str | None) -> str:
        """Compare and rename under an fcntl lock on a sibling file: the lock serializes writers of this key on
        one machine and, through the file system's lock manager (NFSv4, lockd), on several; a process that dies
        holding it loses it at once. The version is the sha256 of the content, so it names bytes, not a time."""
        p = self._path(key)
        data = text.encode("utf-8")

        def write() -> str:
            self._check_root()
            p.parent.mkdir(parents=True, exist_ok=True)
            with _CAS, open(p.with_name(p.name + LOCK_SUFFIX), "a+b") as lock:
                fcntl.lockf(lock, fcntl.LOCK_EX)
                try:
                    try:
                        current: str | None = _digest(p.read_bytes())
                    except FileNotFoundError:
                        current = None
                    if current != version:
                        if current == _digest(data):
                            return current  # our own write, retried after its answer was lost
                        raise WriteConflict(f"{key} in {self.describe()} was changed by another writer")
                    _write_atomically(p, lambda f: f.write(data))
                    self._root_seen = True
                    return _digest(data)
                finally:
                    fcntl.lockf(lock, fcntl.LOCK_UN)

        return self._call(write, f"conditional write of {key}")


def _write_atomically(dst: Path, fill: Callable[[BinaryIO], object],
                      create: Callable[[], None] | None = None) -> None:
    """Write through a '.partial' sibling of this writer's own, fsync, rename: a reader sees the old file or the
    new one, never half of one, and a write cut short leaves no partial file behind. With ``create`` the finished
    file is hard-linked into place instead, which fails where a file exists; ``create`` is then called to judge
    the file that is there (it raises unless it holds the same bytes)."""
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}-{secrets.token_hex(3)}.partial")
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as out:
            fill(out)
            out.flush()
            os.fsync(out.fileno())
        if create is None:
            os.replace(tmp, dst)
        else:
            try:
                os.link(tmp, dst)
            except FileExistsError:
                create()
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def _same_bytes(path: Path, sha256: str, key: str, where: str) -> None:
    """A create-only write found ``path`` there: its own bytes (an upload retried after its answer was lost, or a
    copy from an earlier attempt) are fine; anything else is another writer's, which is never overwritten."""
    if sha256_file(path) != sha256:
        raise WriteConflict(f"{key} in {where} already holds other bytes (written by another session, or left by "
                            "an interrupted one); it is not overwritten")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
