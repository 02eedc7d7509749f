"""What changes while a session trains: the loop's position and counters. Nothing built lives here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..checkpoint.record import Shortened, Stats
from .spikes import SpikeDetector

__all__ = ["Stats", "TrainState"]


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done: the next step trains global batch ``step``
    stats: Stats = field(default_factory=Stats)  # the counters that travel in every checkpoint
    resumed_from: int | None = None  # the step of the verified checkpoint last loaded (a rollback's, since one)
    # The step of the checkpoint this session started from (None: step 0): what the summary and a requeue say it
    # began at, a rollback's reload notwithstanding.
    session_from: int | None = None
    stopped_by: str | None = None  # why the session stopped before its stop step (signal, time budget)
    peak_train: int = 0  # this rank's memory high-water marks, bytes
    peak_eval: int = 0
    # The run's newest validation (val_loss, val_ppl, val_windows, val_step): this session's, or the one the
    # checkpoint it resumed from had (checkpoint.history.newest_validation), so a summary always names one.
    val: dict[str, Any] | None = None
    spikes: SpikeDetector = field(default_factory=SpikeDetector)  # judges each step's loss (train.spike_*)
    # Anytime mode shortened the horizon (session.anytime): in the checkpoint it resumed from, or decided here;
    # every checkpoint keeps it.
    shortened: Shortened | None = None
