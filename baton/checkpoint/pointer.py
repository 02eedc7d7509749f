"""The pointer ``<run>/latest.json``: the commit marker of the relay, one typed record with one parser.

The checkpoint cycle writes it only after the store proved it holds every byte of the checkpoint it names,
and reads it back. Every reader gets a ``Pointer`` from ``read_pointer`` (or ``Pointer.from_json``), which
refuses a damaged or hand-edited one with one line: baton never guesses which checkpoint to trust.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, TypedDict

from .. import __version__, faults
from ..errors import ResumeError, StoreError, VerificationError
from ..store import Store
from .names import MODEL_FILE, REQUIRED, ckpt_path, parse_step

POINTER = "latest.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")
# The pointer's own keys; any other key a later version adds is kept as it is (``extra``).
_KEYS = ("run", "step", "path", "files", "cursor", "complete", "created", "baton_version", "verified", "final",
         "val_loss", "val_ppl", "val_windows", "epoch")


class FileInfo(TypedDict):
    size: int
    sha256: str


Files = dict[str, FileInfo]


@dataclass(frozen=True)
class Lineage:
    """Names a verified checkpoint unambiguously: its step and the sha256 of its weights."""

    step: int
    model_sha256: str

    @classmethod
    def of(cls, step: int, files: Files) -> Lineage:
        return cls(step, files[MODEL_FILE]["sha256"])

    @classmethod
    def from_json(cls, d: Any) -> Lineage | None:
        if isinstance(d, dict) and type(d.get("step")) is int and isinstance(d.get("model_sha256"), str):
            return cls(d["step"], d["model_sha256"])
        return None

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "model_sha256": self.model_sha256}


@dataclass(frozen=True)
class Pointer:
    run: str
    step: int
    path: str  # ckpt_path(step)
    files: Files  # every file of the checkpoint with the size and sha256 the store proved
    cursor: dict[str, Any]  # the data cursor at ``step`` (data.reader.Cursor.to_dict)
    complete: bool = False  # the run reached its horizon and its final model is verified (``final``)
    verified: tuple[str, ...] = ()  # verified checkpoint paths still kept, oldest first, ``path`` last
    final: dict[str, Any] | None = None  # {"path": "final", "files": ...}: the exported model of a complete run
    val_loss: float | None = None  # the horizon's validation (complete runs)
    val_ppl: float | None = None
    val_windows: int | None = None
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    baton_version: str = __version__
    extra: dict[str, Any] = field(default_factory=dict)
    epoch: int | None = None  # the lease epoch of the session that wrote (or sealed) it (store.lease)

    @property
    def lineage(self) -> Lineage:
        return Lineage.of(self.step, self.files)

    def history(self) -> tuple[str, ...]:
        """The verified checkpoints it remembers; a pointer from before the list existed remembers its own."""
        return self.verified or (self.path,)

    def verified_steps(self) -> set[int]:
        return {s for s in (parse_step(h) for h in self.history()) if s is not None} | {self.step}

    def completed(self, final_files: Files, val: dict[str, Any]) -> Pointer:
        """This pointer marking the run complete, with its exported model and final validation."""
        return replace(self, complete=True, final={"path": "final", "files": final_files},
                       val_loss=val.get("val_loss"), val_ppl=val.get("val_ppl"), val_windows=val.get("val_windows"),
                       created=datetime.now(timezone.utc).isoformat(timespec="seconds"), baton_version=__version__)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run, "step": self.step, "path": self.path, "files": self.files,
                               "cursor": self.cursor, "complete": self.complete, "created": self.created,
                               "baton_version": self.baton_version, "verified": list(self.history())}
        if self.final is not None:
            out["final"] = self.final
        for k in ("val_loss", "val_ppl", "val_windows", "epoch"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return {**self.extra, **out}

    @classmethod
    def from_json(cls, p: Any, run: str, key: str) -> Pointer:
        """The pointer in ``p`` (parsed JSON), or ResumeError naming what is wrong with it."""
        if not isinstance(p, dict):
            raise ResumeError(f"pointer {key} is not a JSON object")
        missing = [k for k in ("run", "step", "path", "files", "cursor") if k not in p]
        if missing:
            raise ResumeError(f"pointer {key} lacks {', '.join(missing)}")
        if p["run"] != run:
            raise ResumeError(f"pointer {key} belongs to run {p['run']!r}, not {run!r}")
        if type(p["step"]) is not int or p["step"] < 0:
            raise ResumeError(f"pointer {key} has an invalid step {p['step']!r}")
        _check_inside(p["path"], key)
        # The cycle writes the checkpoint of step N to ckpt_path(N): a pointer that pairs them otherwise was edited.
        if p["path"] != ckpt_path(p["step"]):
            raise ResumeError(f"pointer {key} says step {p['step']} but names {p['path']!r}")
        c = p["cursor"]
        if not isinstance(c, dict):
            raise ResumeError(f"pointer {key} has a cursor that is not a table")
        # Its values are checked where they are used (data.reader.Cursor); a step of its own must be the pointer's.
        if c.get("step", p["step"]) != p["step"] or type(c.get("samples_consumed", 0)) is not int:
            raise ResumeError(f"pointer {key} has a cursor that is not the data position of step {p['step']}")
        files = _files(p["files"], key)
        # The verified checkpoints kept, its own last (a pointer older than the list has none).
        verified = p.get("verified", [p["path"]])
        if not isinstance(verified, list) or not verified or verified[-1] != p["path"] \
                or not all(isinstance(h, str) and parse_step(h) is not None for h in verified):
            raise ResumeError(f"pointer {key} has a verified list {verified!r} that is not checkpoint paths ending "
                              "with its own")
        final = p.get("final")
        if final is not None and not (isinstance(final, dict) and isinstance(final.get("path"), str)
                                      and isinstance(final.get("files"), dict)):
            raise ResumeError(f"pointer {key} has a malformed final entry")
        vals = {k: p.get(k) for k in ("val_loss", "val_ppl", "val_windows")}
        if any(v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))) for v in vals.values()):
            raise ResumeError(f"pointer {key} has a validation value that is not a number")
        return cls(run=p["run"], step=p["step"], path=p["path"], files=files, cursor=p["cursor"],
                   complete=p.get("complete") is True, verified=tuple(verified), final=final,
                   val_loss=vals["val_loss"], val_ppl=vals["val_ppl"], val_windows=vals["val_windows"],
                   created=str(p.get("created", "")), baton_version=str(p.get("baton_version", "")),
                   extra={k: v for k, v in p.items() if k not in _KEYS},
                   epoch=p["epoch"] if type(p.get("epoch")) is int else None)


def make_pointer(run: str, step: int, files: Files, cursor: dict[str, Any], verified: tuple[str, ...]) -> Pointer:
    return Pointer(run=run, step=step, path=ckpt_path(step), files=files, cursor=cursor, verified=verified)


def _files(files: Any, key: str) -> Files:
    if not isinstance(files, dict) or not files:
        raise ResumeError(f"pointer {key} lists no files")
    for name, info in files.items():
        if "/" in name or name in ("", ".", "..") or not isinstance(info, dict) or "sha256" not in info \
                or "size" not in info:
            raise ResumeError(f"pointer {key} has a malformed file entry {name!r}")
    for name in REQUIRED:
        if name not in files:
            raise ResumeError(f"pointer {key} names a checkpoint without {name}")
    for name, info in files.items():
        if type(info["size"]) is not int or info["size"] < 0 or not isinstance(info["sha256"], str) \
                or not _SHA256.fullmatch(info["sha256"]):
            raise ResumeError(f"pointer {key} lists {name!r} with size {info['size']!r} and sha256 "
                              f"{info['sha256']!r}: not a byte count and a sha256 hex digest")
    return files


def _check_inside(path: Any, key: str) -> None:
    """A pointer may only name a checkpoint inside its own run's prefix."""
    if not isinstance(path, str) or not path:
        raise ResumeError(f"pointer {key} has no checkpoint path")
    norm = posixpath.normpath(path)
    if path.startswith("/") or "\\" in path or ".." in path.split("/") or norm != path or not path.startswith("ckpt/"):
        raise ResumeError(f"pointer {key} names {path!r}, outside the run's ckpt/ prefix; refusing it")


def pointer_key(run: str) -> str:
    return f"{run}/{POINTER}"


def read_pointer(store: Store, run: str) -> Pointer | None:
    """The run's pointer; None only when the store says there is none. Anything else raises ResumeError."""
    key = pointer_key(run)
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
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResumeError(f"pointer {key} in {store.describe()} is not valid JSON ({e.msg}){fix}") from None
    try:
        return Pointer.from_json(raw, run, key)
    except ResumeError as e:
        raise ResumeError(f"{e}{fix}") from None


def write_pointer(store: Store, pointer: Pointer) -> None:
    """Write the pointer and prove it by reading it back. A session's store that holds the run's lease
    (``store.lease.FencedStore``) writes it conditionally on its last version, with the lease's epoch."""
    key = pointer_key(pointer.run)
    roll = getattr(store, "roll", None)
    lease = getattr(store, "lease", None)
    if lease is not None:
        pointer = replace(pointer, epoch=lease.epoch)
    doc = pointer.to_json()
    text = json.dumps(doc, indent=1, sort_keys=True)
    if roll is not None:
        roll(key, text)
    else:
        store.write_text(key, text)
    faults.point("pointer.readback", pointer.step)
    back = store.read_text(key)
    if back is None or json.loads(back) != doc:
        raise VerificationError(f"pointer {key} read back from {store.describe()} differs from what was written")


def fallback(pointer: Pointer) -> str:
    """What to do when the pointed checkpoint is unusable: name the older verified ones the pointer remembers."""
    older = [h for h in pointer.verified if h != pointer.path]
    if older:
        return (f"restore it from a copy of the store, or resume from an older verified checkpoint "
                f"({', '.join(older)}: download the folder and pass it as --resume PATH)")
    return "restore it from a copy of the store, or start a new run.name"
