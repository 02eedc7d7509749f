"""A local directory as the store: the default, and the floor every remote backend is measured against.

It keeps no checksums of its own, so listing rehashes the stored bytes: the sha256 it reports is a
statement about what is on disk now, not about what we meant to write.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from ..errors import StoreError
from ..hashing import sha256_file
from .base import ObjectInfo, RangeRead, safe_key


class LocalStore:
    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()

    def describe(self) -> str:
        return f"local store {self.root}"

    def _path(self, key: str) -> Path:
        return self.root / safe_key(key)

    def put_file(self, local: Path, key: str, sha256: str) -> None:
        dst = self._path(key)
        tmp = dst.with_name(dst.name + ".partial")
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            with open(local, "rb") as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 8 << 20)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, dst)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            hint = " (the store's disk is full)" if e.errno == errno.ENOSPC else ""
            raise StoreError(f"could not write {key} to {self.describe()}: {e.strerror or e}{hint}") from None

    def list(self, prefix: str) -> dict[str, ObjectInfo]:
        base = self.root / prefix if prefix else self.root
        start = base if base.is_dir() else base.parent
        out: dict[str, ObjectInfo] = {}
        if not start.is_dir():
            return out
        for p in sorted(start.rglob("*")):
            if not p.is_file() or p.name.endswith(".partial"):
                continue
            key = p.relative_to(self.root).as_posix()
            if key.startswith(prefix):
                out[key] = ObjectInfo(key, p.stat().st_size, sha256_file(p))
        return out

    def read_range(self, key: str, start: int, end: int) -> RangeRead:
        p = self._path(key)
        try:
            size = p.stat().st_size
            with open(p, "rb") as f:
                f.seek(start)
                data = f.read(end - start + 1)
        except FileNotFoundError:
            raise StoreError(f"{key} not found in {self.describe()}") from None
        last = start + len(data) - 1
        return RangeRead(data, 206, f"bytes {start}-{last}/{size}")

    def get_file(self, key: str, local: Path) -> None:
        src = self._path(key)
        if not src.is_file():
            raise StoreError(f"{key} not found in {self.describe()}")
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, local)

    def delete(self, key: str) -> None:
        p = self._path(key)
        p.unlink(missing_ok=True)
        # Tidy empty parent folders up to the root so deleted checkpoints leave no husks.
        for parent in p.parents:
            if parent == self.root or not parent.is_dir() or any(parent.iterdir()):
                break
            parent.rmdir()

    def read_text(self, key: str) -> str | None:
        p = self._path(key)
        try:
            return p.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as e:
            raise StoreError(f"could not read {key} from {self.describe()}: {e}") from None

    def write_text(self, key: str, text: str) -> None:
        p = self._path(key)
        tmp = p.with_name(p.name + ".partial")
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)  # atomic: a reader sees the old pointer or the new one, never half
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"could not write {key} to {self.describe()}: {e.strerror or e}") from None
