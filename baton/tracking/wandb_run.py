"""Weights & Biases: one W&B run per baton run, its id kept in the store, resumed by every session.

Credentials come from the environment (WANDB_API_KEY, or `wandb login` on that machine), never the config;
WANDB_MODE=offline keeps the run on local disk for a later `wandb sync`.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from .base import scalars


class WandbBackend:
    name, live = "wandb", False
    durable = False  # rows are written by W&B's service process later; kept for sure once finish() returns

    def __init__(self, cfg, run_dir: Path):
        self.cfg = cfg
        self.run_dir = run_dir
        self._run: Any = None  # a wandb Run once started (wandb is imported only when configured)

    def start(self, resume_step: int, saved: dict[str, Any]) -> tuple[dict[str, Any], int]:
        import wandb  # seconds to import: only when configured

        lg = self.cfg.log
        run_id = saved.get("id") or secrets.token_hex(6)  # W&B ids: lowercase letters and digits
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=lg.project or self.cfg.run.name, entity=lg.entity or None,
                               name=lg.run_name or self.cfg.run.name, id=run_id, resume="allow",
                               # WANDB_DIR, when set, wins: the offline files may outlive this machine's disk.
                               dir=None if os.environ.get("WANDB_DIR") else str(self.run_dir), config=self.cfg.to_dict(),
                               settings=wandb.Settings(console="off", silent=True))
        # Online, a resumed W&B run knows its newest step: never send one at or below it (W&B refuses them).
        held = max(int(saved.get("logged_to", 0)), self._run.step - 1 if self._run.resumed else 0)
        return {"id": run_id, "project": self._run.project, "entity": lg.entity}, held

    def log(self, step: int, row: dict[str, Any]) -> None:
        self._run.log(scalars(row), step=step)

    def close(self, complete: bool) -> None:
        if self._run is not None:
            self._run.finish(exit_code=0)
            self._run = None
