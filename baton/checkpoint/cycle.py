"""push -> verify -> pointer -> read back -> prune: the only way a checkpoint becomes the baton.

The order is the guarantee. The pointer (``<run>/latest.json``) is the commit marker and is written only
after the store has proven it holds every byte; the local copy is deleted only after the pointer has been
read back. A failure at any point raises before the next stage, so the pointer keeps naming the previous
verified checkpoint and the local copy stays on disk.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from .. import faults
from ..errors import BatonError, Fenced, VerificationError, WriteConflict
from ..hashing import sha256_file
from ..store import Store, delete_keys, delete_prefix, put_files
from .names import ckpt_path, parse_step
from .pointer import POINTER, Files, Pointer, make_pointer, read_pointer, write_pointer

__all__ = ["POINTER", "PushResult", "push_checkpoint", "push_folder", "verify_remote", "write_pointer"]

log = logging.getLogger(__name__)

WINDOW = 64 << 10  # bytes per read-back window
FULL_CHUNK = 8 << 20
READ_BACK_THREADS = 4  # files read back at once (each holds at most one window or FULL_CHUNK in memory)


@dataclass
class PushResult:
    step: int
    path: str  # relative to the run prefix, e.g. ckpt/step-8
    files: Files
    seconds: float
    verified: bool
    timings: dict[str, float] = field(default_factory=dict)


class _HashesOnWrite(Protocol):
    """A store with ``hashes_on_write = True`` (Store.put_file): it hashes what it writes, so takes no sha256."""

    def put_file(self, local: Path, key: str, sha256: str | None, create: bool = False) -> str: ...


def local_manifest(folder: Path) -> Files:
    return {
        p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def store_key(prefix: str, name: str) -> str:
    """``name`` under ``prefix``; the empty prefix is the store's root (where a published dataset lives)."""
    return f"{prefix}/{name}" if prefix else name


def verify_remote(store: Store, prefix: str, files: Mapping[str, Mapping[str, Any]], local: Path, mode: str = "sample",
                  rng: random.Random | None = None, what: str = "") -> None:
    """Prove the store holds ``files`` under ``prefix``: its listing, then bytes read back.

    Raises VerificationError listing every problem; any exception while reading back is a problem, never
    dropped (a listing alone once passed a checkpoint whose read-back was a 404). ``what`` names the
    files in messages (default: the checkpoint at ``prefix``).
    """
    rng = rng or random.Random()
    what = what or f"checkpoint {prefix}"
    problems: list[str] = []
    try:
        listing = store.list(prefix + "/" if prefix else "")
    except Exception as e:
        raise VerificationError(f"could not list {prefix or '/'} in {store.describe()}: {e}") from None
    for name, want in files.items():
        key = store_key(prefix, name)
        got = listing.get(key)
        if got is None:
            problems.append(f"{name}: not listed by the store")
            continue
        if got.size != want["size"]:
            problems.append(f"{name}: store lists {got.size} bytes, pushed {want['size']}")
        if got.sha256 is None:
            problems.append(f"{name}: store lists no sha256")
        elif got.sha256 != want["sha256"]:
            problems.append(f"{name}: store lists sha256 {got.sha256[:12]}…, pushed {want['sha256'][:12]}…")
    sources = sorted({listing[store_key(prefix, n)].source for n in files if store_key(prefix, n) in listing} - {""})
    # The windows are drawn in file order (a seeded rng reproduces them), then read a few files at a time: on
    # a remote store each read is a round trip, and a dataset has hundreds of files.
    todo = [(name, want["size"], read_windows(want["size"], mode, rng)) for name, want in files.items()
            if not any(p.startswith(f"{name}:") for p in problems)]

    def check(item: tuple[str, int, list[tuple[int, int]]]) -> str | None:
        name, size, windows = item
        try:
            _read_back(store, store_key(prefix, name), local / name, size, windows)
        except VerificationError as e:
            return f"{name}: {e}"
        except Exception as e:  # a 404, a reset connection, a bad status: all fail verification
            return f"{name}: read-back failed: {type(e).__name__}: {e}"
        return None

    if todo:
        with ThreadPoolExecutor(min(READ_BACK_THREADS, len(todo))) as pool:
            problems += [p for p in pool.map(check, todo) if p]
    if problems:
        raise VerificationError(
            f"{what} failed verification in {store.describe()}: " + "; ".join(problems)
        )
    log.info("verified %s: %d files, sizes and sha256 (%s) and %s read-back", what, len(files),
             "; ".join(sources) or "no source", "full" if mode == "full" else "windowed")


def read_windows(size: int, mode: str, rng: random.Random) -> list[tuple[int, int]]:
    if size == 0:
        return []
    if mode == "full":
        return [(a, min(a + FULL_CHUNK, size) - 1) for a in range(0, size, FULL_CHUNK)]
    w = min(WINDOW, size)
    mid = rng.randrange(0, size - w + 1)
    return sorted({(0, w - 1), (size - w, size - 1), (mid, mid + w - 1)})


def _read_back(store: Store, key: str, local: Path, size: int, windows: list[tuple[int, int]]) -> None:
    with open(local, "rb") as f:
        for a, b in windows:
            r = store.read_range(key, a, b)
            want_range = f"bytes {a}-{b}/{size}"
            if r.status != 206:
                raise VerificationError(f"range {a}-{b} answered with status {r.status}, not 206 (range ignored?)")
            if r.content_range != want_range:
                raise VerificationError(f"asked for {want_range}, server answered Content-Range {r.content_range!r}")
            if len(r.data) != b - a + 1:
                raise VerificationError(f"range {a}-{b} returned {len(r.data)} bytes, expected {b - a + 1}")
            f.seek(a)
            if r.data != f.read(b - a + 1):
                raise VerificationError(f"bytes {a}-{b} read back differ from the local file")


def push_folder(store: Store, local: Path, prefix: str, mode: str,
                what: str = "", create: bool = False) -> tuple[Files, dict[str, float]]:
    """Upload every file of ``local`` under ``prefix`` and verify it; returns the files and timings. ``what``
    names the files in messages (default: the checkpoint at ``prefix``). ``create``: no file is written over
    another's (``Store.put_file``): a checkpoint's files are then all one writer's, or its verification fails."""
    t0 = time.perf_counter()
    if getattr(store, "hashes_on_write", False):
        # The store hashes each file as it copies it: one read per file instead of two. What it listed
        # later is still checked against these, and the bytes against the local files.
        writer = cast(_HashesOnWrite, store)
        files: Files = {}
        for p in sorted(q for q in local.iterdir() if q.is_file()):
            faults.point("upload")
            files[p.name] = {"size": p.stat().st_size,
                             "sha256": writer.put_file(p, store_key(prefix, p.name), None, create=create)}
        t1 = t0
    else:
        files = local_manifest(local)
        t1 = time.perf_counter()
        put_files(store, [(local / name, store_key(prefix, name), info["sha256"]) for name, info in files.items()],
                  create=create)
    t2 = time.perf_counter()
    faults.point("verify")
    verify_remote(store, prefix, files, local, mode, what=what)
    t3 = time.perf_counter()
    return files, {"hash": t1 - t0, "upload": t2 - t1, "verify": t3 - t2}


def push_checkpoint(store: Store, run: str, local: Path, step: int, cursor: dict[str, Any], mode: str = "sample",
                    keep_last: int = 2, keep_local: bool = False) -> PushResult:
    """The full cycle for one checkpoint folder. Raises (leaving pointer and local copy) on any failure.
    ``keep_local``: the verified local copy stays (for a caller about to load it)."""
    t0 = time.perf_counter()
    path = ckpt_path(step)
    prefix = f"{run}/{path}"
    old, prev = _previous(store, run)  # read before anything is written: what this push may not undo
    if old is not None and step < old.step:
        check_not_behind(store, run, old, step)
    # One read of the lease before the upload: a session taken over since its last renewal (renewals come a
    # third of a lifetime apart) must not spend minutes writing a checkpoint into the new holder's run.
    verify = getattr(store, "verify_lease", None)
    if verify is not None:
        verify()
    try:
        files, timings = push_folder(store, local, prefix, mode, create=True)
    except WriteConflict as e:
        # Files of another writer at this step: one fenced since (the lease says so: Fenced), or a session
        # killed mid-upload. Only the lease's holder gets past ``verify_lease``; the folder is never verified
        # while it holds another's files, so it is cleared and pushed again, unless the pointer counts it as
        # verified: that one is the baton (or one to fall back to), never written over.
        if verify is not None:
            verify()
        if old is not None and step in old.verified_steps() and missing_or_damaged(store, run, old) is None:
            raise BatonError(f"{prefix} in {store.describe()} is a verified checkpoint the pointer counts, and it holds "
                             f"other bytes than this session's step {step} ({e}): it is not written over (resume with "
                             "--resume auto, or train this line of work under a new run.name)") from None
        log.warning("%s held files another session left (%s); removing them and pushing step %d again", prefix, e,
                    step)
        delete_prefix(store, prefix + "/")
        files, timings = push_folder(store, local, prefix, mode, create=True)
    t = time.perf_counter()
    faults.point("pointer", step)
    history = tuple(h for h in prev or () if h != path) + (path,)
    write_pointer(store, make_pointer(run, step, files, cursor, history[-max(keep_last, 1):]))
    timings["pointer"] = time.perf_counter() - t
    # Verified and committed: now, and only now, the local copy may go.
    try:
        if not keep_local:
            shutil.rmtree(local)
    except OSError as e:
        log.warning("checkpoint step %d is verified, but its local copy %s could not be removed (%s)", step, local, e)
    faults.point("prune", step)
    apply_retention(store, run, keep_last, current=path, verified=history if prev is not None else None)
    seconds = time.perf_counter() - t0
    log.info("checkpoint step %d pushed and verified in %.1fs (%s)", step, seconds, store.describe())
    return PushResult(step, path, files, seconds, True, timings)


def missing_or_damaged(store: Store, run: str, pointer: Pointer) -> str | None:
    """What the store's listing says is wrong with the pointer's own checkpoint (a file missing, or of another
    size or sha256 than the pointer records); None when it holds it intact."""
    prefix = f"{run}/{pointer.path}"
    listing = store.list(prefix + "/")
    for name, want in pointer.files.items():
        got = listing.get(f"{prefix}/{name}")
        if got is None:
            return f"{name} is missing"
        if got.size != want["size"] or (got.sha256 is not None and got.sha256 != want["sha256"]):
            return f"{name} is not the file the pointer records"
    return None


def check_not_behind(store: Store, run: str, pointer: Pointer, step: int) -> None:
    """A line of work from ``step``, older than the pointer's: refused while the pointer's checkpoint is intact
    (it would roll the pointer back and write over verified checkpoints). Where that checkpoint is missing or
    damaged, going on from an older one is the recovery, and is said."""
    why = missing_or_damaged(store, run, pointer)
    if why is None:
        raise BatonError(f"step {step} of run {run!r} is older than step {pointer.step}, which the pointer in "
                         f"{store.describe()} names and the store holds intact: going on from it would roll the "
                         "pointer back and write over verified checkpoints (resume with --resume auto, or train from "
                         "the older checkpoint under a new run.name)")
    log.warning("the pointer's checkpoint %s/%s is damaged in %s (%s): going on from the older step %d replaces it",
                run, pointer.path, store.describe(), why, step)


def _previous(store: Store, run: str) -> tuple[Pointer | None, tuple[str, ...] | None]:
    """The current pointer and the verified checkpoints it remembers; (None, None) when there is none or it cannot
    be read (retention then goes by step order)."""
    try:
        old = read_pointer(store, run)
    except BatonError as e:
        log.warning("could not read the previous pointer of %s (%s); retention goes by step order", run, e)
        return None, None
    return old, old.history() if old is not None else None


def finish_pruning(store: Store, run: str, pointer: Pointer, keep_last: int) -> list[str]:
    """At the start of a session: the pruning a killed session began (or never reached) after rolling the
    pointer. Only checkpoints older than the pointer's, beyond the newest ``keep_last`` verified ones, go; the
    pointer's own checkpoint and anything newer (an upload in progress elsewhere) stay."""
    removed = apply_retention(store, run, keep_last, current=pointer.path, verified=pointer.history())
    if removed:
        log.info("finished the pruning an earlier session left undone: removed %s from %s", ", ".join(removed),
                 store.describe())
    return removed


def apply_retention(store: Store, run: str, keep_last: int, current: str,
                    verified: tuple[str, ...] | None = None) -> list[str]:
    """Delete checkpoints up to ``current`` beyond the newest ``keep_last`` verified ones. Failures are
    logged, not fatal.

    ``verified`` lists checkpoint paths known verified (the pointer's history, ``current`` last). Folders
    at or below the current step that are not among the kept verified ones (an upload cut short by a
    kill, a failed verification) are removed too; folders above it are left alone.
    """
    verify = getattr(store, "verify_lease", None)
    if verify is not None:
        verify()  # one read of the lease: a fenced session deletes nothing (Fenced goes up; not a warning)
    try:
        keys = store.list(f"{run}/ckpt/", checksums=False)
    except Exception as e:
        log.warning("retention skipped: could not list %s/ckpt/ (%s)", run, e)
        return []
    steps = steps_in_listing(keys, run)
    current_step = parse_step(current)
    assert current_step is not None, current  # a pointer's path or ckpt_path(step): parsed already
    if current_step not in steps:
        # The pointer names a checkpoint the store does not hold (deleted outside baton, or a pointer edited by
        # hand): the older verified ones are all that is left to resume from, so none of them goes.
        log.warning("retention skipped: the pointer's checkpoint %s/%s is not in %s's listing; nothing is deleted",
                    run, current, store.describe())
        return []
    if verified:
        kept = {current_step} | {s for s in map(parse_step, verified[-keep_last:]) if s is not None}
    else:
        kept = set(sorted((s for s in steps if s <= current_step), reverse=True)[:keep_last])
    removed = []
    for s, ks in sorted(steps.items()):
        if s in kept or s > current_step:
            continue
        try:
            faults.point("prune.delete", s)
            delete_keys(store, sorted(ks))
            removed.append(ckpt_path(s))
        except Fenced:
            raise  # this session may no longer write to the run: it stops, it does not warn and go on
        except Exception as e:  # noqa: BLE001 - the new checkpoint is committed; a leftover costs only space
            log.warning("could not delete old checkpoint %s/%s (%s); it stays in the store", run, ckpt_path(s), e)
    return removed


def steps_in_listing(keys: Any, run: str) -> dict[int, list[str]]:
    """The keys under ``<run>/ckpt/`` of a store's listing, by the step of the checkpoint folder holding them."""
    steps: dict[int, list[str]] = {}
    for key in keys:
        folder, _, rest = key[len(run) + 1 :].rpartition("/")
        step = parse_step(folder) if key.startswith(f"{run}/") and rest else None
        if step is not None:
            steps.setdefault(step, []).append(key)
    return steps
