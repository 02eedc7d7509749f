"""Every configured backend behind one start/log/close, resume-aware across sessions and machines.

The append-only trackers (W&B, MLflow) receive a row only once the checkpoint at or after its step is
verified: a tracker then holds exactly the history the store can resume, so a session killed between a
log and a checkpoint has sent nothing that the next session trains again, and no step is ever sent twice
or out of order (W&B refuses a step below its newest anyway). The cost is a lag of one checkpoint
interval; the progress line, metrics.jsonl and TensorBoard stay live (resuming rewrites those).

What the trackers hold is kept in the store beside the run, ``<run>/trackers.json``: each tracker run's
id and the newest step it is known to hold. A session on any machine reopens the same tracker runs, sends
the verified rows they lack from the checkpoint's metrics.jsonl, and carries on from there.

"Known to hold": MLflow's client writes before it returns, so a row counts once sent. W&B hands rows to a
service process that writes (or uploads) them later; a killed machine takes unwritten rows with it, so
its rows count only once the W&B run was finished cleanly at the end of a session. After a kill, the next
session sends the rows since then again: those W&B did keep are at or below its newest step and W&B
drops them (the values are the same: the resume is exact), the lost ones fill the gap.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BatonError, StoreError
from ..guard import without_credentials
from ..store import Store
from .base import Backend

log = logging.getLogger(__name__)

FORMAT = "baton-trackers-v1"
START_HINTS = {
    "tensorboard": "check that the run folder (run.local_dir) is writable",
    "wandb": "check WANDB_API_KEY (or `wandb login`), log.project and log.entity, or set WANDB_MODE=offline",
    "mlflow": "check log.mlflow_uri (or MLFLOW_TRACKING_URI: a reachable server, or a database; MLflow 3 wants "
              "MLFLOW_ALLOW_FILE_STORE=true for file: folders) and the MLFLOW_TRACKING_* credentials",
}
STATE = "trackers.json"


def state_key(run: str) -> str:
    return f"{run}/{STATE}"


@dataclass
class TrackerState:
    """``<run>/trackers.json``: each append-only tracker's run (its ids, and ``logged_to``: the newest step it is
    known to hold) and the horizon whose final evaluation was sent. One definition for its writer and reader."""

    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # backend name -> its ids and ``logged_to``
    complete_step: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, **self.runs}
        if self.complete_step is not None:
            out["complete_step"] = self.complete_step
        return out

    @classmethod
    def from_json(cls, doc: Any) -> TrackerState:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError("not a baton trackers record")
        runs = {k: v for k, v in doc.items() if k not in ("format", "complete_step")}
        if not all(isinstance(v, dict) and type(v.get("logged_to", 0)) is int for v in runs.values()):
            raise ValueError("a tracker's entry is not a table with a step count logged_to")
        step = doc.get("complete_step")
        if step is not None and type(step) is not int:
            raise ValueError("complete_step is not a step")
        return cls(runs, step)


def read_state(store: Store, run: str) -> TrackerState:
    text = store.read_text(state_key(run))
    if text is None:
        return TrackerState()
    try:
        return TrackerState.from_json(json.loads(text))
    except ValueError as e:
        raise StoreError(f"{state_key(run)} in {store.describe()} is damaged ({e}); delete it to start new "
                         "tracker runs, or restore it to continue the old ones") from None


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The metrics rows of ``path``. A line that is not one (not JSON, not an object with a whole step) is left
    out with one warning: the history feeds charts and summaries, and a damaged line must not end a resume."""
    if not path.is_file():
        return []
    rows, bad = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict) and type(row.get("step")) is int:
            rows.append(row)
        else:
            bad += 1
    if bad:
        log.warning("%s: %d line%s not a metrics row (a JSON object with a step), left out", path, bad,
                    " is" if bad == 1 else "s are")
    return rows


class Trackers:
    """Rank 0's fan-out. A backend that fails while training is dropped with a warning: losing a chart must
    never stop a run. At start, failures raise: better to fail now than to find no charts in a week."""

    def __init__(self, backends: list[Backend], store: Store, run: str, history: Path):
        self.backends = backends
        self.store, self.run, self.history = store, run, history
        self.sent: dict[str, int] = {}  # backend -> newest step it holds
        self.pending: list[tuple[int, dict[str, Any]]] = []  # rows waiting for a verified checkpoint
        self._appending = any(not b.live for b in backends)  # an append-only tracker: rows wait in pending
        self.state = TrackerState()

    def start(self, resume_step: int) -> None:
        saved = read_state(self.store, self.run) if any(not b.live for b in self.backends) else TrackerState()
        if resume_step == 0 and any(v.get("logged_to") for v in saved.runs.values()):
            # The store lost the run's checkpoints and it starts afresh: new tracker runs, not a rewind.
            log.info("%s names tracker runs of an earlier start of %r: starting new ones", state_key(self.run),
                     self.run)
            saved = TrackerState()
        self.state = TrackerState(dict(saved.runs), saved.complete_step)
        rows = None
        for b in self.backends:
            keep, held = self._start(b, resume_step, saved.runs.get(b.name, {}) if not b.live else {})
            self.sent[b.name] = held
            if held < resume_step:  # the verified history this backend lacks (a wiped machine, a lost flush)
                rows = read_rows(self.history) if rows is None else rows
                self._send(b, [(r["step"], r) for r in rows if held < r["step"] <= resume_step])
            if not b.live:
                self.state.runs[b.name] = {**keep, "logged_to": self.sent[b.name]}
        self._save()

    def log(self, step: int, row: dict[str, Any]) -> None:
        # Every step: ``_send``'s rule for one row, without its lists (a live backend has no log_many).
        for b in self.backends:
            if b.live:
                held = self.sent.get(b.name)
                if held is not None and step > held and self._guard(b, b.log, step, row):
                    self.sent[b.name] = step
        if self._appending:
            self.pending.append((step, row))

    def verified(self, step: int) -> None:
        """The checkpoint at ``step`` is verified: its rows go to the append-only trackers."""
        ready = [(s, r) for s, r in self.pending if s <= step]
        self.pending = [(s, r) for s, r in self.pending if s > step]
        if not ready:
            return
        for b in self.backends:
            if not b.live:
                self._send(b, ready)
                if getattr(b, "durable", False) and b.name in self.sent:
                    self.state.runs[b.name]["logged_to"] = self.sent[b.name]
        self._save()

    def rewind(self, step: int) -> None:
        """A loss-spike rollback returned to the verified checkpoint at ``step``: the rows past it are undone.

        Rows waiting for a verification were never sent (the checkpoint rolled back to is the newest
        verified one), so they are dropped; the live backends are reopened at ``step``, as a resumed
        session opens them (metrics.jsonl is rewritten from the checkpoint's copy, TensorBoard purges the
        later events), and the replayed steps are sent again.
        """
        self.pending = [(s, r) for s, r in self.pending if s <= step]
        for b in self._active():
            if b.live and self._guard(b, b.close, False) and self._guard(b, b.start, step, {}):
                self.sent[b.name] = min(self.sent[b.name], step)

    def final(self, step: int, values: dict[str, Any]) -> None:
        """The evaluation at the horizon, after the run was marked complete (metrics.jsonl keeps one row per
        step; the final validation is in the pointer and run_summary.json)."""
        if self.state.complete_step == step:
            return  # an earlier session sent it and died before it could finish
        for b in self.backends:
            if b.name != "jsonl" and b in self._active():
                self._guard(b, b.log, step, values)
        self.state.complete_step = step
        self._save()

    def close(self, complete: bool) -> None:
        for b in self._active():
            if self._guard(b, b.close, complete) and not b.live:
                self.state.runs[b.name]["logged_to"] = self.sent[b.name]  # a clean close: everything sent is kept
        self._save()

    # -------------------------------------------------------------------------------------------------
    @staticmethod
    def _start(b: Backend, resume_step: int, saved: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """A tracker that cannot start is one line naming it and what to check, before any step is trained."""
        try:
            return b.start(resume_step, saved)
        except Exception as e:  # noqa: BLE001 - any library's failure, reported as the backend's
            if b.name == "jsonl":  # the run's own history: its failure is the run's, not a tracker's
                raise
            said = without_credentials(" ".join(str(e).split()))
            said = said if len(said) <= 300 else said[:297] + "..."
            raise BatonError(f"tracker {b.name} could not start ({type(e).__name__}: {said}); {START_HINTS[b.name]}, "
                             f"or remove {b.name!r} from log.backends") from None

    def _active(self) -> list[Backend]:
        return [b for b in self.backends if b.name in self.sent]

    def _send(self, b: Backend, rows: list[tuple[int, dict[str, Any]]]) -> None:
        if b.name not in self.sent:
            return
        rows = [(s, r) for s, r in rows if s > self.sent[b.name]]  # never a step twice, never backwards
        if not rows:
            return
        many = getattr(b, "log_many", None)
        if many is not None:
            ok = self._guard(b, many, rows)
        else:
            ok = all(self._guard(b, b.log, s, r) for s, r in rows)
        if ok:
            self.sent[b.name] = rows[-1][0]

    def _guard(self, b: Backend, fn, *args) -> bool:
        try:
            fn(*args)
            return True
        except Exception as e:  # noqa: BLE001 - a tracker's trouble is reported, training goes on
            if b.name == "jsonl":  # the run's own history (it travels in every checkpoint): never dropped
                raise
            log.warning("tracker %s failed (%s: %s); it gets no more metrics this session", b.name,
                        type(e).__name__, without_credentials(str(e)))
            self.sent.pop(b.name, None)
            return False

    def _save(self) -> None:
        if not self.state.runs and self.state.complete_step is None:
            return
        try:
            self.store.write_text(state_key(self.run), json.dumps(self.state.to_json(), indent=1, sort_keys=True))
        except (BatonError, OSError) as e:
            log.warning("could not write %s (%s); the next session may resend rows the trackers hold",
                        state_key(self.run), e)
