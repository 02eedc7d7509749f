"""Finding the baton: read the pointer, refuse anything suspicious, pull into an empty folder, check."""

from __future__ import annotations

import json
import posixpath
import re
import shutil
from pathlib import Path
from typing import Any

from ..errors import LocalDiskError, ResumeError, StoreError
from ..hashing import sha256_file
from ..store import Store
from .cycle import POINTER, ckpt_path
from .state import REQUIRED


def read_pointer(store: Store, run: str) -> dict[str, Any] | None:
    """The run's pointer; None only when the store says there is none. Anything else raises."""
    key = f"{run}/{POINTER}"
    try:
        text = store.read_text(key)
    except StoreError as e:
        raise ResumeError(f"could not read the pointer {key} from {store.describe()}: {e}") from None
    if text is None:
        return None
    # The pointer is the commit marker: a damaged one is never repaired by guessing a checkpoint.
    fix = (f" (baton will not guess which checkpoint to trust: restore {key} from a copy of the store, or "
           "start a new run.name)")
    try:
        p = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResumeError(f"pointer {key} in {store.describe()} is not valid JSON ({e.msg}){fix}") from None
    try:
        check_pointer(p, run, key)
    except ResumeError as e:
        raise ResumeError(f"{e}{fix}") from None
    return p


def check_pointer(p: Any, run: str, key: str) -> None:
    if not isinstance(p, dict):
        raise ResumeError(f"pointer {key} is not a JSON object")
    missing = [k for k in ("run", "step", "path", "files", "cursor") if k not in p]
    if missing:
        raise ResumeError(f"pointer {key} lacks {', '.join(missing)}")
    if p["run"] != run:
        raise ResumeError(f"pointer {key} belongs to run {p['run']!r}, not {run!r}")
    if type(p["step"]) is not int or p["step"] < 0:
        raise ResumeError(f"pointer {key} has an invalid step {p['step']!r}")
    check_inside(p["path"], key)
    # The cycle writes the checkpoint of step N to ckpt_path(N): a pointer that pairs them otherwise was edited.
    if p["path"] != ckpt_path(p["step"]):
        raise ResumeError(f"pointer {key} says step {p['step']} but names {p['path']!r}")
    if not isinstance(p["cursor"], dict):
        raise ResumeError(f"pointer {key} has a cursor that is not a table")
    files = p["files"]
    if not isinstance(files, dict) or not files:
        raise ResumeError(f"pointer {key} lists no files")
    for name, info in files.items():
        if "/" in name or name in ("", ".", "..") or not isinstance(info, dict) or "sha256" not in info or "size" not in info:
            raise ResumeError(f"pointer {key} has a malformed file entry {name!r}")
    for name in REQUIRED:
        if name not in files:
            raise ResumeError(f"pointer {key} names a checkpoint without {name}")
    for name, info in files.items():
        if type(info["size"]) is not int or info["size"] < 0 or not isinstance(info["sha256"], str) \
                or not re.fullmatch(r"[0-9a-f]{64}", info["sha256"]):
            raise ResumeError(f"pointer {key} lists {name!r} with size {info['size']!r} and sha256 "
                              f"{info['sha256']!r}: not a byte count and a sha256 hex digest")


def check_inside(path: Any, key: str) -> None:
    """A pointer may only name a checkpoint inside its own run's prefix."""
    if not isinstance(path, str) or not path:
        raise ResumeError(f"pointer {key} has no checkpoint path")
    norm = posixpath.normpath(path)
    if path.startswith("/") or "\\" in path or ".." in path.split("/") or norm != path or not path.startswith("ckpt/"):
        raise ResumeError(f"pointer {key} names {path!r}, outside the run's ckpt/ prefix; refusing it")


def pull_checkpoint(store: Store, run: str, pointer: dict[str, Any], dest: Path) -> Path:
    """Download the pointed checkpoint into an empty ``dest`` and check every file's size and sha256."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    # Said before the first byte moves: a full disk found half-way through a large download wastes the
    # transfer, and its error (from whichever file overflows) says less.
    need, free = sum(int(i["size"]) for i in pointer["files"].values()), shutil.disk_usage(dest).free
    if need > free:
        raise ResumeError(f"checkpoint {pointer['path']} needs {need / 2**20:,.1f} MiB but the disk of {dest.parent} "
                          f"has {free / 2**20:,.1f} MiB free (free space there or set run.local_dir to a larger "
                          "disk, then rerun); the store is untouched")
    for name, info in pointer["files"].items():
        key = f"{run}/{pointer['path']}/{name}"
        try:
            store.get_file(key, dest / name)
        except LocalDiskError as e:
            raise ResumeError(f"could not download {key}: {e}; the store is untouched") from None
        except StoreError as e:
            raise ResumeError(f"the pointer names {key}, but it could not be downloaded: {e} (check the store and "
                              f"rerun; if the file is gone, {_fallback(pointer)})") from None
        size = (dest / name).stat().st_size
        digest = sha256_file(dest / name)
        if size != info["size"] or digest != info["sha256"]:
            raise ResumeError(
                f"{key} downloaded with size {size} and sha256 {digest[:12]}…, but the pointer says "
                f"{info['size']} and {info['sha256'][:12]}…: the store's copy is damaged ({_fallback(pointer)})"
            )
    return dest


def _fallback(pointer: dict[str, Any]) -> str:
    """What to do when the pointed checkpoint is unusable: name the older verified ones the pointer remembers."""
    older = [h for h in pointer.get("verified") or [] if isinstance(h, str) and h != pointer.get("path")]
    if older:
        return (f"restore it from a copy of the store, or resume from an older verified checkpoint "
                f"({', '.join(older)}: download the folder and pass it as --resume PATH)")
    return "restore it from a copy of the store, or start a new run.name"
