"""Any verified checkpoint of a run by its step, not only the pointer's: for `baton export/eval/publish --step`.

A checkpoint in the store is verified when the pointer names it or a session's ledger record booked its
verification (the same rule as `baton status`). An older one has no pointer listing its files, so its
files are what the store lists with their sha256; the pull checks every downloaded file against that.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import BatonError
from ..planning import ledger as L
from ..store import Store
from .cycle import ckpt_path
from .pull import read_pointer
from .state import REQUIRED


def verified_steps(store: Store, run: str, pointer: dict[str, Any] | None) -> set[int]:
    records, _ = L.read_ledger(store, run)
    steps = {c["step"] for r in records for c in r.get("checkpoints", []) if c.get("verified")}
    if pointer:
        steps.add(pointer["step"])
    return steps


def present_steps(store: Store, run: str) -> list[int]:
    """Steps with a folder under ``<run>/ckpt/``, verified or not."""
    return sorted({int(m.group(1)) for k in L._keys(store, f"{run}/ckpt/")
                   if (m := re.match(rf"{re.escape(run)}/ckpt/step-(\d+)/", k))})


def locate(store: Store, run: str, step: int | None = None) -> dict[str, Any]:
    """A pointer-shaped record (step, path, files) of the verified checkpoint at ``step`` (None: the pointer's)."""
    pointer = read_pointer(store, run)
    if pointer is None:
        raise BatonError(f"{store.describe()} holds no checkpoint for run {run!r} (train first)")
    if step is None or step == pointer["step"]:
        return pointer
    usable = sorted(verified_steps(store, run, pointer) & set(present_steps(store, run)))
    if step not in usable:
        raise BatonError(f"step {step} is not a verified checkpoint of run {run!r} in {store.describe()} (verified "
                         f"there: {', '.join(map(str, usable)) or 'none'}; `baton status` lists them)")
    prefix = f"{run}/{ckpt_path(step)}/"
    listing = store.list(prefix)
    files = {k[len(prefix):]: {"size": o.size, "sha256": o.sha256} for k, o in listing.items()
             if "/" not in k[len(prefix):]}
    missing = [n for n in REQUIRED if n not in files]
    unsure = sorted(n for n, i in files.items() if i["sha256"] is None)
    if missing or unsure:
        raise BatonError(f"checkpoint {prefix} in {store.describe()} cannot be checked ("
                         + (f"missing {', '.join(missing)}" if missing else f"no sha256 listed for {', '.join(unsure)}")
                         + "); use another step")
    return {"run": run, "step": step, "path": ckpt_path(step), "files": files, "cursor": pointer["cursor"],
            "verified": pointer.get("verified")}
