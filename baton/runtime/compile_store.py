"""The compile cache in the run's store: ``<run>/compile-cache/<key>.bin`` and its record ``<key>.json``.

Pushed like a checkpoint: the blob is uploaded and proven (the store's listing of size and sha256, ranged
read-backs), and only then is its record written, naming the size and sha256 it must have. Pulled like one:
the record first, the blob after, its size and sha256 checked against the record. The record is one typed
definition with one parser (``CacheRecord``). Nothing here ever fails a session: a missing, damaged, truncated
or foreign blob is a ``Pulled`` with no path and a one-line note, and the session compiles cold.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..checkpoint.cycle import push_folder
from ..errors import BatonError, Fenced
from ..hashing import sha256_bytes, sha256_file
from ..reads import one_line
from ..store import Store, delete_keys

log = logging.getLogger(__name__)

CACHE_DIR = "compile-cache"
RECORD_FORMAT = "baton-compile-cache-record-v1"
KEEP = 3  # keys kept per run (a run may alternate between kinds of machine); older ones are pruned


def blob_key(run: str, key: str) -> str:
    return f"{run}/{CACHE_DIR}/{key}.bin"


def record_key(run: str, key: str) -> str:
    return f"{run}/{CACHE_DIR}/{key}.json"


@dataclass(frozen=True)
class CacheRecord:
    """What a pushed blob is: its key, the table the key hashes, its size and sha256, who pushed it when."""

    key: str
    size: int
    sha256: str
    parts: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    session: str | None = None
    kernels: int = 0  # C++ kernels carried beside torch's artifacts

    def to_json(self) -> dict[str, Any]:
        return {"format": RECORD_FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, d: Any) -> CacheRecord:
        """The record in ``d`` (parsed JSON); ValueError naming what is wrong."""
        if not isinstance(d, dict) or d.get("format") != RECORD_FORMAT:
            raise ValueError("not a baton compile-cache record")
        if not isinstance(d.get("key"), str) or not isinstance(d.get("sha256"), str) or len(d["sha256"]) != 64:
            raise ValueError("key or sha256 is missing")
        if type(d.get("size")) is not int or d["size"] < 0:
            raise ValueError("size is not a whole number of bytes")
        if not isinstance(d.get("parts", {}), dict) or type(d.get("kernels", 0)) is not int:
            raise ValueError("parts or kernels is malformed")
        return cls(d["key"], d["size"], d["sha256"], d.get("parts", {}), str(d.get("created", "")),
                   d.get("session") if isinstance(d.get("session"), str) else None, d.get("kernels", 0))


@dataclass(frozen=True)
class Pulled:
    """The verified blob on this machine (None: there is none to load) and the one line that says why."""

    path: Path | None
    note: str
    record: CacheRecord | None = None
    missing: bool = False  # the store holds none for this key: how every run starts, not a problem


def pull(store: Store, run: str, key: str, dest: Path) -> Pulled:
    """The blob for ``key`` into ``dest``, checked against its record; never raises for what the store holds."""
    dest.unlink(missing_ok=True)  # a copy an earlier session left here is never taken for this one's
    where = f"{record_key(run, key)} in {store.describe()}"
    try:
        text = store.read_text(record_key(run, key))
    except BatonError as e:
        return Pulled(None, f"compile cache: could not read {where} ({one_line(e, 200)}); compiling cold")
    if text is None:
        return Pulled(None, f"compile cache: none in {store.describe()} for this torch, device and model "
                            f"(key {key[:12]}); compiling cold, and pushing one after the first step", missing=True)
    try:
        rec = CacheRecord.from_json(json.loads(text))
    except (ValueError, TypeError) as e:
        return Pulled(None, f"compile cache: {where} is unreadable ({e}); compiling cold")
    if rec.key != key:
        return Pulled(None, f"compile cache: {where} is for key {rec.key[:12]}, not this session's {key[:12]} "
                            "(another torch, device or model); compiling cold")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        store.get_file(blob_key(run, key), dest)
    except (BatonError, OSError) as e:
        dest.unlink(missing_ok=True)
        return Pulled(None, f"compile cache: {blob_key(run, key)} could not be downloaded ({one_line(e, 200)}); compiling cold")
    size, digest = dest.stat().st_size, sha256_file(dest)
    if size != rec.size or digest != rec.sha256:
        dest.unlink(missing_ok=True)
        return Pulled(None, f"compile cache: {blob_key(run, key)} downloaded with size {size} and sha256 "
                            f"{digest[:12]}, but its record says {rec.size} and {rec.sha256[:12]} (damaged or "
                            "truncated); compiling cold")
    return Pulled(dest, f"compile cache: pulled {size / 2**20:.1f} MiB (key {key[:12]}, pushed {rec.created} by "
                        f"{rec.session or 'an earlier session'})", rec)


def push(store: Store, run: str, key: str, parts: dict[str, Any], blob: bytes, kernels: int, mode: str,
         session: str | None) -> CacheRecord:
    """Upload and verify the blob, then write its record, then prune older keys. Raises what the store raises."""
    with tempfile.TemporaryDirectory(prefix="baton-compile-cache-") as tmp:
        folder = Path(tmp)
        (folder / f"{key}.bin").write_bytes(blob)
        push_folder(store, folder, f"{run}/{CACHE_DIR}", mode, what=f"the compile cache {key[:12]}")
    rec = CacheRecord(key, len(blob), sha256_bytes(blob), parts,
                      datetime.now(timezone.utc).isoformat(timespec="seconds"), session, kernels)
    store.write_text(record_key(run, key), json.dumps(rec.to_json(), indent=1, default=str))
    prune(store, run, keep=KEEP, current=key)
    return rec


def prune(store: Store, run: str, keep: int, current: str) -> list[str]:
    """Remove all but the ``keep`` newest keys (by their records' time); ``current`` always stays. A failure
    warns: a leftover costs only space."""
    try:
        listing = store.list(f"{run}/{CACHE_DIR}/", checksums=False)
        stamps: dict[str, str] = {}
        for k in listing:
            name = k.rsplit("/", 1)[-1]
            if name.endswith(".json"):
                text = store.read_text(k)
                try:
                    stamps[name[:-5]] = CacheRecord.from_json(json.loads(text or "")).created
                except (ValueError, TypeError):
                    stamps[name[:-5]] = ""
        keys = {k.rsplit("/", 1)[-1].rsplit(".", 1)[0] for k in listing}
        newest = sorted((k for k in keys if k != current), key=lambda k: stamps.get(k, ""), reverse=True)
        gone = sorted(newest[max(keep - 1, 0):])
        doomed = [k for k in listing if k.rsplit("/", 1)[-1].rsplit(".", 1)[0] in gone]
        if doomed:
            delete_keys(store, sorted(doomed))
        return gone
    except Fenced:
        raise
    except BatonError as e:
        log.warning("compile cache: could not prune older keys in %s/%s (%s); they stay", run, CACHE_DIR, e)
        return []


def remove_local(path: Path) -> None:
    """The pulled copy, once loaded (or refused)."""
    try:
        path.unlink(missing_ok=True)
        if path.parent.is_dir() and not any(path.parent.iterdir()):
            shutil.rmtree(path.parent, ignore_errors=True)
    except OSError:
        pass
