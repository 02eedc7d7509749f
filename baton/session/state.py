"""What changes while a session trains: the loop's position and counters. Nothing built lives here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .spikes import SpikeDetector


@dataclass
class Stats:
    """Counters that travel in the checkpoint so a resumed run reports whole-run totals."""

    nonfinite_skips: int = 0
    consecutive_nonfinite: int = 0
    last_loss: float | None = None
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    spike_window: list[float] = field(default_factory=list)  # the spike detector's recent losses
    rollbacks: list[dict[str, Any]] = field(default_factory=list)  # one record per spike rollback (session.rollback)

    @classmethod
    def from_checkpoint(cls, saved: dict[str, Any]) -> Stats:
        return cls(**{k: v for k, v in saved.items() if k in cls.__dataclass_fields__})


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done: the next step trains global batch ``step``
    stats: Stats = field(default_factory=Stats)
    resumed_from: int | None = None  # the step of the verified checkpoint this session started from
    stopped_by: str | None = None  # why the session stopped before its stop step (signal, time budget)
    peak_train: int = 0  # this rank's memory high-water marks, bytes
    peak_eval: int = 0
    val: dict[str, float] | None = None  # the final evaluation, at the horizon
    spikes: SpikeDetector = field(default_factory=SpikeDetector)  # judges each step's loss (train.spike_*)
