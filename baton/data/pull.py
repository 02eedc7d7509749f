"""The dataset on this machine before the first step: ``data.url`` pulled into ``data.dir``, every file verified.

Order, so that a kill at any moment leaves nothing that looks whole and is not:

1. the store's ``manifest.json`` is read and checked against itself (an edited manifest stops here), and the
   store's listing against it (a missing or resized shard stops here, before any download);
2. each local file is judged: reused without reading it when this machine verified it before and its size,
   inode and mtime are unchanged (the record lives under ``run.local_dir``, never in ``data.dir``, which may
   be a read-only mount); else hashed when its size is right; else pulled;
3. missing files are downloaded a few at a time (``data.transfer_workers``), each streamed to
   ``<name>.pull``, hashed, fsynced and renamed to its name only when its sha256 is the manifest's;
4. the manifest is written last; a stale local manifest is removed before the first download.

A rerun after a kill keeps every file already under its final name (hashed, not downloaded again). When
``data.dir`` is the store's own folder (a read-only input dataset used in place), nothing is written there.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import faults
from ..config import Config
from ..errors import BatonError, DataError
from ..hashing import sha256_file
from .manifest import MANIFEST, manifest_problems, parse_manifest
from .remote import data_store, dataset_files, same_folder

log = logging.getLogger(__name__)

REPUBLISH = "republish the dataset from the machine that prepared it (`baton publish-data -c CONFIG`)"
RECORDS = ".baton-data"  # under run.local_dir: what this machine verified, per data folder
LOCK = ".baton-lock"  # in data.dir: held by the one process pulling into it


@dataclass
class DataSource:
    """Where this session's data came from and what it cost to make it present and verified."""

    location: str
    fingerprint: str
    files: int
    pulled_files: int
    pulled_bytes: int
    hashed_files: int
    reused_files: int
    seconds: float
    in_place: bool = False

    def line(self) -> str:
        how = "used in place" if self.in_place else (
            f"{self.pulled_files} pulled ({self.pulled_bytes / 1e6:,.1f} MB)")
        return (f"data from {self.location}: {self.files} files, {how}, {self.hashed_files} hashed, "
                f"{self.reused_files} reused as verified before; fingerprint {self.fingerprint}; "
                f"{self.seconds:.1f} s")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ensure_data(cfg: Config, check: Callable[[dict[str, Any]], None] | None = None) -> DataSource | None:
    """Make ``data.dir`` hold the dataset published at ``data.url``, verified; None when data.url is unset.

    ``check`` is called with the store's manifest, once it is known sound and before anything is read or
    written locally: what can refuse the dataset on its manifest alone (the resume's drift check) costs no
    download."""
    if not cfg.data.url:
        return None
    t0 = time.perf_counter()
    store = data_store(cfg)
    where = store.describe()
    raw = store.read_text(MANIFEST)
    if raw is None:
        raise DataError(f"{MANIFEST} not found in {where} (data.url): no dataset is published there; run `baton "
                        "publish-data -c CONFIG` (or `baton prepare --publish`) where the data was prepared")
    m = parse_manifest(raw, f"{MANIFEST} in {where}", REPUBLISH)
    problems = manifest_problems(m)
    if problems:
        raise DataError(f"{MANIFEST} in {where} was changed after it was published ({problems[0]}); {REPUBLISH}")
    files = dataset_files(m)
    listing = store.list("", checksums=False)
    absent = [n for n in files if n not in listing]
    resized = [f"{n} ({listing[n].size:,} bytes, its tokens make {w['size']:,})" for n, w in files.items()
               if n in listing and w["size"] is not None and listing[n].size != w["size"]]
    if absent or resized:
        what = (f"missing: {', '.join(absent[:3])}" if absent else "") + ("; " if absent and resized else "") + (
            f"wrong size: {', '.join(resized[:3])}" if resized else "")
        raise DataError(f"{where} does not hold the dataset its {MANIFEST} describes ({what}); {REPUBLISH}")
    for n, w in files.items():
        w["size"] = listing[n].size if w["size"] is None else w["size"]
    if check is not None:
        check(m)

    local = Path(cfg.data.dir)
    in_place = same_folder(store, local)
    with nullcontext() if in_place else _sole_puller(local):
        return _make_present(cfg, store, local, in_place, raw, m, files, t0)


def _make_present(cfg: Config, store, local: Path, in_place: bool, raw: str, m: dict[str, Any],
                  files: dict[str, dict[str, Any]], t0: float) -> DataSource:
    where = store.describe()
    record_path = _record_path(cfg, local)
    record = _load_record(record_path, m["fingerprint"])
    current = _local_manifest(local) == raw
    reused: list[str] = []
    hashed: list[str] = []
    todo: list[str] = []
    known: dict[str, list] = {}
    with _pool(cfg) as pool:  # hashing releases the GIL: the files of a big corpus hash in parallel
        judged = list(zip(files, pool.map(lambda n: _judge(local / n, files[n], record.get(n) if current else None),
                                          list(files))))
    for name, (state, stamp) in judged:
        {"reused": reused, "hashed": hashed, "pull": todo}[state].append(name)
        if stamp is not None:
            known[name] = stamp
    if todo and in_place:
        raise DataError(f"{', '.join(todo[:3])} in {local} (data.dir, which is data.url itself) do not match its "
                        f"{MANIFEST}: the folder is damaged and baton does not write into it; restore it, or set "
                        "data.dir to another folder to pull a copy")
    pulled_bytes = 0
    if not in_place and (todo or not current):
        _clear_for(local, files)
        pulled_bytes = _pull(store, local, todo, files, cfg, known) if todo else 0
        _write_atomically(local / MANIFEST, raw.encode("utf-8"))
    _save_record(record_path, local, m["fingerprint"], known)
    src = DataSource(where, m["fingerprint"], len(files), len(todo), pulled_bytes, len(hashed) + len(todo),
                     len(reused), time.perf_counter() - t0, in_place)
    log.info("%s; SHASHED %d files total_tokens %s mismatches 0", src.line(), len(files), f"{m['total_tokens']:,}")
    return src


@contextmanager
def _sole_puller(local: Path) -> Iterator[None]:
    """Hold ``data.dir``'s pull lock: one process at a time judges and pulls into a folder. Nodes that share a
    file system (an NFS home), or two sessions on one machine, would otherwise pull into the same folder at
    once, each clearing and renaming the other's files; the one that waits then finds the copy verified."""
    try:
        local.mkdir(parents=True, exist_ok=True)
        fd = os.open(local / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a folder this process cannot write: nothing is pulled into it (the pull says so)
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is pulling the dataset into %s; waiting for it to finish", local)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _pool(cfg: Config) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(1, cfg.data.transfer_workers))


def _judge(path: Path, want: dict[str, Any], rec: list | None) -> tuple[str, list | None]:
    """("reused" | "hashed" | "pull", the (size, inode, mtime_ns, sha256) stamp of a verified file)."""
    try:
        st = path.stat()
    except OSError:
        return "pull", None
    stamp = [st.st_size, st.st_ino, st.st_mtime_ns, want["sha256"]]
    if rec == stamp:
        return "reused", stamp
    if st.st_size != want["size"] or sha256_file(path) != want["sha256"]:
        return "pull", None
    return "hashed", stamp


def _clear_for(local: Path, files: dict[str, dict[str, Any]]) -> None:
    """Make ``local`` ready to take this dataset: no manifest while it changes (a kill then leaves a folder
    training will not take), no leftovers of a killed pull, no shard of another dataset."""
    try:
        local.mkdir(parents=True, exist_ok=True)
        (local / MANIFEST).unlink(missing_ok=True)
        for p in list(local.glob("*.pull")) + list(local.glob("*.pull.partial")):
            p.unlink()
        for p in local.glob("shard-*.bin"):
            if p.name not in files:
                p.unlink()
    except OSError as e:
        raise DataError(f"cannot write into data.dir {local} to pull the dataset ({e.strerror or e}); set data.dir "
                        "to a writable folder") from None


def _pull(store, local: Path, names: list[str], files: dict[str, dict[str, Any]], cfg: Config,
          known: dict[str, list]) -> int:
    log.info("pulling %d of %d files (%s MB) from %s into %s", len(names), len(files),
             f"{sum(files[n]['size'] for n in names) / 1e6:,.1f}", store.describe(), local)

    def get(item: tuple[int, str]) -> tuple[str, str | BatonError | None]:
        i, name = item
        faults.point("data.pull", i)
        tmp = local / (name + ".pull")
        try:
            store.get_file(name, tmp)
            got = sha256_file(tmp)
            if got != files[name]["sha256"]:
                return name, (f"{name} from {store.describe()} has sha256 {got[:12]}…, its {MANIFEST} says "
                              f"{files[name]['sha256'][:12]}…: the stored copy was changed after publishing")
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, local / name)
            st = (local / name).stat()
            known[name] = [st.st_size, st.st_ino, st.st_mtime_ns, got]
            return name, None
        except BatonError as e:  # the store or this machine's disk failed, not the published bytes
            return name, e
        finally:
            tmp.unlink(missing_ok=True)

    with _pool(cfg) as pool:
        outcomes = [p for _, p in pool.map(get, enumerate(names)) if p]
    changed = [p for p in outcomes if isinstance(p, str)]
    if changed:
        raise DataError(f"{'; '.join(changed[:3])}{'; …' if len(changed) > 3 else ''}; {REPUBLISH}")
    failed = [p for p in outcomes if isinstance(p, BatonError)]
    if failed:
        raise failed[0]  # with its own fix (the store is down, the disk is full): republishing would not help
    return sum(files[n]["size"] for n in names)


def _local_manifest(local: Path) -> str | None:
    try:
        return (local / MANIFEST).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _record_path(cfg: Config, local: Path) -> Path:
    key = hashlib.sha256(str(local.resolve()).encode()).hexdigest()[:16]
    return Path(cfg.run.local_dir) / RECORDS / f"{key}.json"


def _load_record(path: Path, fingerprint: str) -> dict[str, list]:
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(rec, dict) or rec.get("fingerprint") != fingerprint or not isinstance(rec.get("files"), dict):
        return {}
    return rec["files"]


def _save_record(path: Path, local: Path, fingerprint: str, files: dict[str, list]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, json.dumps({"dir": str(local.resolve()), "fingerprint": fingerprint,
                                            "files": files}, indent=1).encode())
    except OSError as e:  # only a cache: the next session hashes the files again
        log.warning("could not record the verified data files in %s (%s)", path, e)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".pull")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
