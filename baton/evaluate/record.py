"""The evaluation record ``<run>/eval/<step>.json``: one typed record with one parser.

A text object beside, never inside, the checkpoint folders; `baton publish` reuses it for the model card
only when it scored what the config names now (``evaluated``, by content).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .. import __version__
from ..errors import BatonError
from ..store import Store

FORMAT = "baton-eval-v1"


def eval_key(run: str, step: int) -> str:
    return f"{run}/eval/{step}.json"


@dataclass(frozen=True)
class EvalRecord:
    run: str
    step: int
    tokens_seen: int
    heldout: dict[str, Any]  # loss, ppl, bits_per_byte, windows, tokens, bytes
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # eval file name -> its scores and path
    tasks: dict[str, dict[str, float]] = field(default_factory=dict)  # lm-eval task -> metric -> value
    evaluated: dict[str, Any] = field(default_factory=dict)  # what was scored, by content (evaluate.run.Plan.spec)
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    baton_version: str = __version__

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "run": self.run, "step": self.step, "tokens_seen": self.tokens_seen,
                "heldout": self.heldout, "files": self.files, "tasks": self.tasks, "evaluated": self.evaluated,
                "created": self.created, "baton_version": self.baton_version}

    @classmethod
    def from_json(cls, d: Any) -> EvalRecord | None:
        """The record in ``d``, or None when it is not one of this format (it is then evaluated again)."""
        tables = ("heldout", "files", "tasks", "evaluated")
        if not (isinstance(d, dict) and d.get("format") == FORMAT and type(d.get("step")) is int
                and type(d.get("tokens_seen", 0) or 0) is int
                and isinstance(d.get("run"), str) and all(isinstance(d.get(k, {}), dict) for k in tables)):
            return None
        return cls(run=d["run"], step=d["step"], tokens_seen=int(d.get("tokens_seen") or 0), heldout=d.get("heldout", {}),
                   files=d.get("files", {}), tasks=d.get("tasks", {}), evaluated=d.get("evaluated", {}),
                   created=str(d.get("created", "")), baton_version=str(d.get("baton_version", "")))


def read_record(store: Store, run: str, step: int, spec: dict[str, Any] | None = None) -> EvalRecord | None:
    """The evaluation record of ``step``; with ``spec``, only one that evaluated what it names (a record of
    other files, tasks or settings is stale for it)."""
    text = store.read_text(eval_key(run, step))
    if text is None:
        return None
    try:
        rec = EvalRecord.from_json(json.loads(text))
    except json.JSONDecodeError:
        return None
    if rec is None or rec.step != step:
        return None
    return rec if spec is None or rec.evaluated == spec else None


def write_record(store: Store, record: EvalRecord) -> str:
    key = eval_key(record.run, record.step)
    text = json.dumps(record.to_json(), indent=1, sort_keys=True)
    store.write_text(key, text)
    if store.read_text(key) != text:
        raise BatonError(f"the evaluation record {key} read back from {store.describe()} differs from what was written")
    return key
