"""Trackers across sessions: wiped machines, a SIGKILL between a log and a checkpoint, periodic validation.

One W&B run (offline, read back from its run files), one MLflow run (local file store, read back with its
client) and TensorBoard (its event reader) must each hold every step once, in order, with the same values
as metrics.jsonl; and the run must end bit-identical to one trained without validation or trackers.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

from baton.cli import main
from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors
from support.readers import mlflow_steps, tensorboard_steps, wandb_runs

STEPS = list(range(1, 21))
VAL_STEPS = [5, 10, 15, 20]


def test_trackers_hold_every_step_once_across_wipes_and_a_kill(make_config, baton_cli, tmp_path, monkeypatch):
    cfg = str(make_config())
    runs, store, server = tmp_path / "runs", tmp_path / "store", tmp_path / "wandb-server"
    uri = f"file://{tmp_path / 'mlruns'}"
    # The W&B files stand for W&B's server: they live outside the run folder that the wipes delete.
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(server), "WANDB_SILENT": "true", "MLFLOW_ALLOW_FILE_STORE": "true"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    server.mkdir()
    common = ["-c", cfg, "--no-progress", "--set", "train.ckpt_every=4"]
    tracked = [*common, "--set", "train.eval_every=5", "--set", 'log.backends=["tensorboard","wandb","mlflow"]',
               "--set", f"log.mlflow_uri={uri}"]

    assert main(["train", *common, "--set", "run.name=plain"]) == 0  # no validation, no trackers
    assert main(["train", *tracked, "--stop-after-steps", "8"]) == 0
    shutil.rmtree(runs / "test")  # a new machine: nothing local survives
    assert main(["train", *tracked, "--stop-after-steps", "14"]) == 0
    shutil.rmtree(runs / "test")

    # Resumed at 14, checkpoint at 16, killed after logging step 18 (each step paused so the kill lands there).
    # Its run folder stays: TensorBoard's events past the checkpoint must be purged by the next session.
    # A machine of its own: not this test process's W&B service (whose address wandb left in the environment).
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    proc = baton_cli.start("train", *tracked, env={"BATON_FAULT_PAUSE": "step=0.5"})  # a session of its own
    deadline = time.time() + 300
    while time.time() < deadline:
        metrics = runs / "test" / "metrics.jsonl"
        if metrics.exists() and any(r["step"] >= 18 for r in read_metrics(runs / "test")):
            break
        assert proc.poll() is None, proc.stderr_text()[-3000:]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole session, W&B's service process with it, as a preemption does
    assert proc.wait(timeout=60).returncode == -signal.SIGKILL
    assert store_checkpoint_tensors(store, "test")[2]["step"] == 16
    assert main(["train", *tracked]) == 0

    rows = read_metrics(runs / "test")
    assert [r["step"] for r in rows] == STEPS  # metrics.jsonl: every step once
    assert [r["step"] for r in rows if "val_loss" in r] == VAL_STEPS[:-1]  # the horizon's is the final one
    assert all(r["eval_seconds"] > 0 for r in rows if "val_loss" in r)
    loss = {r["step"]: r["loss"] for r in rows}

    # Evaluation changed nothing: weights, moments and the train-loss trace equal the plain run's, exactly.
    model_a, optim_a, pa = store_checkpoint_tensors(store, "plain")
    model_b, optim_b, pb = store_checkpoint_tensors(store, "test")
    assert pb["complete"] and pb["step"] == 20
    assert_tensors_equal(model_a, model_b)
    assert_tensors_equal(optim_a, optim_b)
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(runs / "plain")] == \
        [(r["step"], r["loss"], r["grad_norm"]) for r in rows]
    assert pa["val_loss"] == pb["val_loss"]

    # W&B: four sessions appended to one run; together each step once, in order, same values.
    sessions = wandb_runs(server / "wandb")
    # (The killed session may have written nothing at all: W&B's service writes its run file lazily.)
    assert len(sessions) == 4 and len({run_id for run_id, _ in sessions if run_id is not None}) == 1
    history, dropped = [], []
    for _, rs in sessions:
        for step, values in rs:
            # What W&B keeps when the sessions are synced: a step above the run's newest (it drops the rest).
            (history if not history or step > history[-1][0] else dropped).append((step, values))
    # Resent after the kill: only rows the killed session may have handed to W&B before it died (same values).
    assert all(15 <= s <= 18 and v["train/loss"] == loss[s] for s, v in dropped)
    assert [s for s, _ in history] == STEPS
    assert {s: v["train/loss"] for s, v in history} == loss
    assert [s for s, v in history if "val/loss" in v] == VAL_STEPS
    assert dict(history)[20]["val/loss"] == pb["val_loss"]

    # MLflow: one run, each step once per metric.
    run_id = __import__("json").loads((store / "test" / "trackers.json").read_text())["mlflow"]["run_id"]
    assert mlflow_steps(uri, run_id, "train/loss") == sorted(loss.items())
    assert [s for s, _ in mlflow_steps(uri, run_id, "val/loss")] == VAL_STEPS

    # TensorBoard: refilled from metrics.jsonl on the wiped machine; the killed session's steps past its
    # checkpoint purged by the resume.
    assert [s for s, _ in tensorboard_steps(runs / "test" / "tensorboard", "train/loss")] == STEPS
    assert [s for s, _ in tensorboard_steps(runs / "test" / "tensorboard", "val/loss")] == VAL_STEPS


def test_a_line_of_the_history_that_is_not_a_row_is_left_out_with_a_warning(tmp_path, caplog):
    """metrics.jsonl feeds the summary and the charts: a damaged line (its checkpoint re-hashed by hand) must not
    end the resume that reads it."""
    import logging

    from baton.tracking.trackers import read_rows

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\ngarbage\n[1, 2]\n{"val_loss": 1.0}\n\n{"step": 2, "val_loss": 1.5}\n')
    with caplog.at_level(logging.WARNING):
        rows = read_rows(path)
    assert rows == [{"step": 1, "loss": 2.0}, {"step": 2, "val_loss": 1.5}]
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: 3 lines are not a metrics row (a JSON object with a step), left out"]
