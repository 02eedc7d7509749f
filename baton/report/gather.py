"""What the report says, as numbers: gathered from the store's pointer, checkpoint metrics and ledger."""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..checkpoint.history import newest_validation, read_history
from ..checkpoint.names import METRICS_FILE
from ..checkpoint.pointer import Pointer, read_pointer
from ..config import Config
from ..errors import BatonError
from ..evaluate.record import read_record
from ..planning import ledger as L
from ..runs import split_run
from ..store import RetryPolicy, Store, open_store
from ..tracking.trackers import read_rows
from ..views.status import branches_status, status


def _rows(store: Store, run: str, pointer: Pointer | None) -> list[dict[str, Any]]:
    """The metrics rows the pointer's checkpoint carries (every step up to it)."""
    if pointer is None:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        key = f"{run}/{pointer.path}/{METRICS_FILE}"
        if key not in store.list(f"{run}/{pointer.path}/", checksums=False):
            return []
        store.get_file(key, Path(tmp) / METRICS_FILE)
        return read_rows(Path(tmp) / METRICS_FILE)


def _evals(store: Store, run: str) -> list[dict[str, Any]]:
    """The held-out losses `baton eval` recorded for the run's checkpoints (``<run>/eval/<step>.json``), by step:
    the same number a run's own validation reports."""
    out = []
    for key in L.list_keys(store, f"{run}/eval/"):
        name = key.rsplit("/", 1)[-1]
        if not (name.endswith(".json") and name[:-5].isdigit()):
            continue
        try:
            rec = read_record(store, run, int(name[:-5]))
        except BatonError:
            continue  # a damaged record is not a point of the curve
        if rec is not None and isinstance(rec.heldout.get("loss"), (int, float)):
            out.append({"step": rec.step, "val_loss": rec.heldout["loss"]})
    return sorted(out, key=lambda v: v["step"])


def _val(rows: list[dict[str, Any]], pointer: Pointer | None) -> list[dict[str, Any]]:
    """The run's validations: each metrics row that carries one, and the horizon's (in the pointer alone)."""
    val = [{"step": r["step"], "val_loss": r["val_loss"], "val_ppl": r["val_ppl"]} for r in rows if "val_loss" in r]
    final = newest_validation([], pointer)  # the horizon's, which no metrics row carries
    if final is not None:
        val.append({"step": final["val_step"], "val_loss": final["val_loss"], "val_ppl": final["val_ppl"]})
    return val


def _branches(store: Store, run: str, tokens_per_step: int) -> list[dict[str, Any]]:
    """Each cooldown branch of the run: where it starts, how far it got, and its validations after the branch point
    (its metrics rows up to the branch point are the main run's)."""
    out = []
    for b in branches_status(store, run, tokens_per_step):
        try:
            pointer = read_pointer(store, b["run"])
            val = _val(_rows(store, b["run"], pointer), pointer)
            evals = _evals(store, b["run"])
        except BatonError as e:
            b = {**b, "problem": b["problem"] or str(e)}
            pointer, val, evals = None, [], []
        out.append({**b, "val": [v for v in val if v["step"] > b["step"]],
                    "evals": [v for v in evals if v["step"] > b["step"]]})
    return out


def gather(cfg: Config) -> dict[str, Any]:
    store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
    run = cfg.run.name
    history = read_history(store, run)
    pointer = history.pointer
    rows = _rows(store, run, pointer)
    st = status(cfg, forecast_curve=True)
    tps = st["tokens_per_step"]
    sessions = []
    for i, rec in enumerate(history.sessions, 1):
        lo, hi = rec.steps_from, rec.steps_to
        mine = [r for r in rows if lo is not None and hi is not None and lo < r["step"] <= hi]
        mfu = [r["mfu"] for r in mine if isinstance(r.get("mfu"), (int, float))]
        sessions.append({"n": i, "session": rec.session, "started": rec.started, "steps_from": lo,
                         "steps_to": hi, "tokens_per_s": rec.tokens_per_s,
                         "mfu": statistics.median(mfu) if mfu else None, "billed_hours": L.billed_hours(rec),
                         "outcome": rec.outcome, "device": rec.device, "accelerators": rec.accelerators,
                         "settings": rec.settings, "took_over": rec.took_over,
                         "startup": dataclasses.asdict(rec.startup) if rec.startup is not None else None,
                         "startup_seconds": rec.startup_seconds})
    # What the relay forecast when each session started, beside what happened (planning.ledger.ForecastNote).
    forecasts = [{"n": i, "session": rec.session, **asdict(rec.forecast)}
                 for i, rec in enumerate(history.sessions, 1) if rec.forecast is not None]
    done = next((rec for rec in history.sessions if rec.outcome == "completed" and rec.ended), None)
    anytime = [{"n": i, "session": rec.session, **asdict(e)} for i, rec in enumerate(history.sessions, 1)
               for e in rec.anytime]
    val = _val(rows, pointer)
    return {
        "run": run, "store": store.describe(), "tokens_per_step": tps, "total_steps": st["total_steps"],
        "pointer_step": pointer.step if pointer else None, "complete": bool(pointer and pointer.complete),
        "verified_steps": history.verified_steps(),
        "rows": rows, "val": val, "sessions": sessions,
        # Where each session stopped (a killed one: its last heartbeat) and where each resumed.
        "session_ends": [s["steps_to"] for s in sessions if s["steps_to"] is not None],
        "resumes": [s["steps_from"] for s in sessions if s["steps_from"]],
        "spikes": [{"step": r["step"], "loss": r["loss"], "score": r["spike_score"], "windows": r.get("spike_windows")}
                   for r in rows if "spike_score" in r],
        "last_train_loss": rows[-1]["loss"] if rows else None,
        "eta": st.get("eta"), "eta_problem": st.get("plan_problem"), "sessions_left": st.get("sessions_left"),
        "stepping_hours_left": st.get("stepping_hours_left"), "ledger": st["ledger"],
        "simulated": st.get("simulated"), "cadence": st.get("cadence"),
        "planned_steps": st["planned_steps"], "shortened": st["shortened"], "forecasts": forecasts,
        "anytime": anytime, "finished": {"at": done.ended, "step": done.steps_to, "session": done.session}
        if done is not None else None,
        "problems": history.ledger_problems,
        # Validation against tokens: `baton eval`'s records, and each cooldown branch's (a main run's only).
        "evals": _evals(store, run),
        "branches": _branches(store, run, tps) if split_run(run)[1] is None else [],
    }
