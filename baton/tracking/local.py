"""The local backends: metrics.jsonl (the run's history, which travels in every checkpoint) and TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from .base import scalars


class JsonlBackend:
    """metrics.jsonl, one row per step, line-buffered so each step is on disk when it ends. Resuming has
    already replaced the file with the checkpoint's copy, so it holds exactly the steps up to the resume."""

    name, live = "jsonl", True

    def __init__(self, path: Path):
        self.path = path
        self._f: TextIO | None = None

    def start(self, resume_step: int, saved: dict[str, Any]) -> tuple[dict[str, Any], int]:
        return {}, resume_step

    def log(self, step: int, row: dict[str, Any]) -> None:
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8", buffering=1)
        self._f.write(json.dumps(row) + "\n")

    def close(self, complete: bool) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class TensorBoardBackend:
    """Event files under the local run folder. A resumed session writes a purge marker at its first step,
    so TensorBoard drops what a killed session logged past the checkpoint; a wiped folder is refilled from
    metrics.jsonl."""

    name, live = "tensorboard", True

    def __init__(self, logdir: Path):
        self.logdir = logdir
        self._w: Any = None  # a SummaryWriter once started (tensorboard is imported only when configured)

    def start(self, resume_step: int, saved: dict[str, Any]) -> tuple[dict[str, Any], int]:
        from torch.utils.tensorboard import SummaryWriter

        held = resume_step if self.logdir.is_dir() and any(self.logdir.iterdir()) else 0
        self._w = SummaryWriter(str(self.logdir), purge_step=held + 1 if held else None)
        return {}, held

    def log(self, step: int, row: dict[str, Any]) -> None:
        for tag, value in scalars(row).items():
            self._w.add_scalar(tag, value, step)

    def close(self, complete: bool) -> None:
        if self._w is not None:
            self._w.close()
            self._w = None
