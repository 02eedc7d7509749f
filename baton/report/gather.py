"""What the report says, as numbers: gathered from the store's pointer, checkpoint metrics and ledger."""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from pathlib import Path
from typing import Any

from ..checkpoint.history import newest_validation, read_history
from ..checkpoint.names import METRICS_FILE
from ..config import Config
from ..planning import ledger as L
from ..store import RetryPolicy, open_store
from ..tracking.trackers import read_rows
from ..views.status import status


def gather(cfg: Config) -> dict[str, Any]:
    store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
    run = cfg.run.name
    history = read_history(store, run)
    pointer = history.pointer
    rows: list[dict[str, Any]] = []
    if pointer is not None:
        with tempfile.TemporaryDirectory() as tmp:
            key = f"{run}/{pointer.path}/{METRICS_FILE}"
            if key in store.list(f"{run}/{pointer.path}/", checksums=False):
                store.get_file(key, Path(tmp) / METRICS_FILE)
                rows = read_rows(Path(tmp) / METRICS_FILE)
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
    val = [{"step": r["step"], "val_loss": r["val_loss"], "val_ppl": r["val_ppl"]} for r in rows if "val_loss" in r]
    final = newest_validation([], pointer)  # the horizon's, which no metrics row carries
    if final is not None:
        val.append({"step": final["val_step"], "val_loss": final["val_loss"], "val_ppl": final["val_ppl"]})
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
        "problems": history.ledger_problems,
    }
