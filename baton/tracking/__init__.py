"""Metrics to trackers: metrics.jsonl, TensorBoard, Weights & Biases, MLflow, behind one interface."""

from __future__ import annotations

from pathlib import Path

from ..store import Store
from .base import Backend
from .names import BACKENDS, check_installed
from .trackers import Trackers

__all__ = ["BACKENDS", "Trackers", "check_installed", "open_trackers"]


def open_trackers(cfg, store: Store, resume_step: int, metrics_path: Path) -> Trackers:
    """Rank 0: the configured backends, started at the resumed step (metrics.jsonl is always one of them)."""
    from .local import JsonlBackend, TensorBoardBackend

    names = cfg.log.backends
    check_installed(names)
    backends: list[Backend] = [JsonlBackend(metrics_path)]
    if "tensorboard" in names:
        backends.append(TensorBoardBackend(cfg.run_dir / "tensorboard"))
    if "wandb" in names:
        from .wandb_run import WandbBackend

        backends.append(WandbBackend(cfg, cfg.run_dir))
    if "mlflow" in names:
        from .mlflow_run import MlflowBackend

        backends.append(MlflowBackend(cfg))
    t = Trackers(backends, store, cfg.run.name, metrics_path)
    t.start(resume_step)
    return t
