"""What the store says about a run, answered in one place: which checkpoints are verified, which step a
command may use, the newest validation. `baton status`, `baton report`, `export/eval/publish --step` and the
session's own resume all ask here, so they cannot disagree.

A checkpoint in the store is **verified** when the pointer's verified list (or its step) names it, or a
session's ledger record booked its verification, **and** the store still lists every file a checkpoint
needs. A folder under ``ckpt/`` that is neither is an upload that never passed (kept for inspection, never
resumed from). The ledger matters for the case the pointer cannot show: a checkpoint older than the
pointer's verified list that retention could not delete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BatonError
from ..planning import ledger as L
from ..store import Store
from .cycle import steps_in_listing
from .names import CKPT_DIR, REQUIRED, ckpt_path
from .pointer import Pointer, read_pointer


@dataclass(frozen=True)
class StoredCheckpoint:
    step: int
    booked: bool  # the pointer or a ledger record says the store verified it
    whole: bool  # the store lists every file a checkpoint needs
    pointer: bool  # the pointer names it

    @property
    def verified(self) -> bool:
        return self.booked and self.whole


@dataclass(frozen=True)
class RunHistory:
    run: str
    store: str  # the store's description
    pointer: Pointer | None
    pointer_problem: str | None  # why the pointer could not be read (``read_history(strict=False)`` only)
    sessions: list[L.LedgerRecord]
    ledger_problems: list[str]
    checkpoints: list[StoredCheckpoint]  # every checkpoint folder in the store, by step

    def verified_steps(self) -> list[int]:
        return [c.step for c in self.checkpoints if c.verified]

    def locate(self, step: int | None) -> int:
        """The step of the verified checkpoint ``step`` names (None: the pointer's), or one line saying why not."""
        if self.pointer is None:
            raise BatonError(f"{self.store} holds no checkpoint for run {self.run!r} (train first)")
        if step is None:
            return self.pointer.step
        if step not in self.verified_steps():
            raise BatonError(f"step {step} is not a verified checkpoint of run {self.run!r} in {self.store} (verified "
                             f"there: {', '.join(map(str, self.verified_steps())) or 'none'}; `baton status` lists them)")
        return step


def read_history(store: Store, run: str, strict: bool = True) -> RunHistory:
    """The run's pointer, ledger and checkpoint folders. ``strict``: a pointer that cannot be read raises (as it
    does for anything that acts on it); else it is reported in ``pointer_problem`` (for the views)."""
    try:
        pointer, problem = read_pointer(store, run), None
    except BatonError as e:
        if strict:
            raise
        pointer, problem = None, str(e)
    records, problems = L.read_ledger(store, run)
    booked = L.verified_steps(records) | (pointer.verified_steps() if pointer else set())
    folders = steps_in_listing(L.list_keys(store, f"{run}/{CKPT_DIR}/"), run)
    checkpoints = [StoredCheckpoint(step=s, booked=s in booked,
                                    whole={f"{run}/{ckpt_path(s)}/{n}" for n in REQUIRED} <= set(keys),
                                    pointer=pointer is not None and s == pointer.step)
                   for s, keys in sorted(folders.items())]
    return RunHistory(run, store.describe(), pointer, problem, records, problems, checkpoints)


def locate(store: Store, run: str, step: int | None = None) -> Pointer:
    """A pointer-shaped record (step, path, files) of the verified checkpoint at ``step`` (None: the pointer's),
    for `baton export/eval/publish --step`. An older checkpoint has no pointer listing its files: its files are
    what the store lists with their sha256, and the pull checks every downloaded file against that."""
    history = read_history(store, run)
    wanted = history.locate(step)
    pointer = history.pointer
    assert pointer is not None  # locate() refused a run without one
    if wanted == pointer.step:
        return pointer
    prefix = f"{run}/{ckpt_path(wanted)}/"
    listing = store.list(prefix)
    files = {k[len(prefix):]: {"size": o.size, "sha256": o.sha256} for k, o in listing.items()
             if "/" not in k[len(prefix):]}
    unsure = sorted(n for n, i in files.items() if i["sha256"] is None)
    if unsure:
        raise BatonError(f"checkpoint {prefix} in {store.describe()} cannot be checked (no sha256 listed for "
                         f"{', '.join(unsure)}); use another step")
    return Pointer(run=run, step=wanted, path=ckpt_path(wanted), files=files,  # type: ignore[arg-type]
                   cursor=pointer.cursor, verified=pointer.verified)


def newest_validation(rows: list[dict[str, Any]], pointer: Pointer | None = None) -> dict[str, Any] | None:
    """The newest validation of a run: the complete pointer's (the horizon's), else the newest metrics row that
    carries one (``train.eval_every``), with the step it was made at."""
    if pointer is not None and pointer.complete and pointer.val_loss is not None:
        return {"val_loss": pointer.val_loss, "val_ppl": pointer.val_ppl, "val_windows": pointer.val_windows,
                "val_step": pointer.step}
    for r in reversed(rows):
        if isinstance(r.get("val_loss"), (int, float)) and type(r.get("step")) is int:
            return {"val_loss": r["val_loss"], "val_ppl": r.get("val_ppl"), "val_windows": r.get("val_windows"),
                    "val_step": r["step"]}
    return None
