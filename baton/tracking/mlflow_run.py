"""MLflow: one MLflow run per baton run, its id kept in the store; the client API only (no global state).

The tracking URI comes from log.mlflow_uri or MLFLOW_TRACKING_URI; credentials only from the environment
(MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN).
"""

from __future__ import annotations

import time
from typing import Any

from .base import scalars

BATCH = 1000  # MLflow's limit of metrics per log_batch call


class MlflowBackend:
    name, live = "mlflow", False
    durable = True  # log_batch returns once the tracking store has written the rows

    def __init__(self, cfg):
        self.cfg = cfg
        self._client = None
        self._run_id: str | None = None

    def start(self, resume_step: int, saved: dict[str, Any]) -> tuple[dict[str, Any], int]:
        from mlflow.tracking import MlflowClient  # slow to import: only when configured

        lg = self.cfg.log
        self._client = MlflowClient(tracking_uri=lg.mlflow_uri or None)
        self._run_id = saved.get("run_id")
        if self._run_id is None:
            name = lg.experiment or lg.project or self.cfg.run.name
            exp = self._client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else self._client.create_experiment(name)
            self._run_id = self._client.create_run(exp_id, run_name=lg.run_name or self.cfg.run.name,
                                                   tags={"baton.run": self.cfg.run.name}).info.run_id
        return {"run_id": self._run_id}, int(saved.get("logged_to", 0))

    def log(self, step: int, row: dict[str, Any]) -> None:
        self.log_many([(step, row)])

    def log_many(self, rows: list[tuple[int, dict[str, Any]]]) -> None:
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        metrics = [Metric(k, v, ms, step) for step, row in rows for k, v in scalars(row).items()]
        for i in range(0, len(metrics), BATCH):
            self._client.log_batch(self._run_id, metrics=metrics[i : i + BATCH])

    def close(self, complete: bool) -> None:
        if self._client is not None and complete:
            self._client.set_terminated(self._run_id, "FINISHED")
        self._client = None
