"""Pulling the baton: the checkpoint a pointer names, into an empty folder, every file checked."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from ..errors import BatonError, LocalDiskError, ResumeError, StoreError
from ..hashing import sha256_file
from ..store import Store
from .names import STATE_FILE
from .pointer import Pointer, fallback, read_pointer
from .record import CheckpointState, parse_state_text

__all__ = ["pull_checkpoint", "read_pointer", "stored_state"]


def stored_state(store: Store, pointer: Pointer) -> CheckpointState | None:
    """The pointer's state.json, read from the store (a few kB) when it holds it as the pointer says; else None,
    and the resume itself reports what is wrong with the checkpoint."""
    key = f"{pointer.run}/{pointer.path}/{STATE_FILE}"
    try:
        text = store.read_text(key)
    except BatonError:
        return None
    if text is None or hashlib.sha256(text.encode("utf-8")).hexdigest() != pointer.files[STATE_FILE]["sha256"]:
        return None
    return parse_state_text(text, key)


def pull_checkpoint(store: Store, run: str, pointer: Pointer, dest: Path) -> Path:
    """Download the pointed checkpoint into an empty ``dest`` and check every file's size and sha256."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    # Said before the first byte moves: a full disk found half-way through a large download wastes the
    # transfer, and its error (from whichever file overflows) says less.
    need, free = sum(i["size"] for i in pointer.files.values()), shutil.disk_usage(dest).free
    if need > free:
        raise ResumeError(f"checkpoint {pointer.path} needs {need / 2**20:,.1f} MiB but the disk of {dest.parent} "
                          f"has {free / 2**20:,.1f} MiB free (free space there or set run.local_dir to a larger "
                          "disk, then rerun); the store is untouched")
    for name, info in pointer.files.items():
        key = f"{run}/{pointer.path}/{name}"
        try:
            store.get_file(key, dest / name)
        except LocalDiskError as e:
            raise ResumeError(f"could not download {key}: {e}; the store is untouched") from None
        except StoreError as e:
            folder = f"{run}/{pointer.path}"
            if not _holds_any(store, folder):  # the whole folder is gone, not one file: name the folder
                raise ResumeError(f"the pointer names the checkpoint folder {folder}, but {store.describe()} holds "
                                  f"nothing under it (deleted or pruned outside baton?): {fallback(pointer)}") from None
            raise ResumeError(f"the pointer names {key}, but it could not be downloaded: {e} (check the store and "
                              f"rerun; if the file is gone, {fallback(pointer)})") from None
        size = (dest / name).stat().st_size
        digest = sha256_file(dest / name)
        if size != info["size"] or digest != info["sha256"]:
            raise ResumeError(
                f"{key} downloaded with size {size} and sha256 {digest[:12]}…, but the pointer says "
                f"{info['size']} and {info['sha256'][:12]}…: the store's copy is damaged ({fallback(pointer)})"
            )
    return dest


def _holds_any(store: Store, folder: str) -> bool:
    """Whether the store lists anything under ``folder`` (True when it cannot even list: the download's own
    error then says more)."""
    try:
        return bool(store.list(folder + "/", checksums=False))
    except StoreError:
        return True
