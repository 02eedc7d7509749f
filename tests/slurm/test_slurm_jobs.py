"""Real sbatch jobs of the test config on the one-node cluster (tests/slurm/conftest.py).

Each step of a job pauses a fixed time (``BATON_FAULT_PAUSE=step=S``, before the step runs), so a run lasts
longer than SLURM's shortest time limit (one minute) whatever the machine's speed: the sessions a job needs
vary with the machine, what the tests check does not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from baton.planning.ledger import read_ledger
from baton.store.local import LocalStore
from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors, write_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm")]

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 900  # a ceiling that catches a hang; a job here takes one to three minutes
# Short enough for a one-minute job: the session stops this long before the job's end time, plus the measured
# step and the checkpoint guess (a second or two for the test model).
BUDGET = """
[budget]
margin_minutes = 0.2
heartbeat_minutes = 0
"""

SCRIPT = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --time={time}
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={out}
#SBATCH --chdir={root}
exec {python} -m baton.cli train --config {cfg} --no-progress {args}
"""


def make_job(base: Path, data: Path, time: str = "1", args: str = "") -> tuple[Path, Path, Path]:
    """(script, config, store) of a job training the test config into its own store."""
    cfg = write_config(base / "cfg.toml", data_dir=data, store=base / "store", runs=base / "runs")
    cfg.write_text(cfg.read_text() + BUDGET)
    script = base / "job.sh"
    script.write_text(SCRIPT.format(name=base.name, time=time, out=base / "job.out", root=ROOT, python=sys.executable,
                                    cfg=cfg, args=args))
    return script, cfg, base / "store"


def job_env(pause: float) -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
            "BATON_FAULT_PAUSE": f"step={pause}"}


def sessions(store: Path) -> list:
    records, problems = read_ledger(LocalStore(str(store)), "test")
    assert not problems
    return records


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prepared_data, baton_cli) -> Path:
    """The store of the same run trained in one uninterrupted session, outside SLURM."""
    base = tmp_path_factory.mktemp("slurm-reference")
    cfg = write_config(base / "cfg.toml", data_dir=prepared_data, store=base / "store", runs=base / "runs")
    cfg.write_text(cfg.read_text() + BUDGET)
    baton_cli("train", "--config", str(cfg), "--no-progress", check=True)
    return base / "store"


def assert_same_final_state(store: Path, reference: Path) -> None:
    model, optim, pointer = store_checkpoint_tensors(store, "test")
    ref_model, ref_optim, ref_pointer = store_checkpoint_tensors(reference, "test")
    assert pointer["step"] == ref_pointer["step"] == 20 and pointer["complete"] is True
    assert_tensors_equal(model, ref_model)
    assert_tensors_equal(optim, ref_optim)


def test_a_job_shorter_than_the_run_requeues_itself_until_the_run_is_complete(slurm_cluster, prepared_data,
                                                                            tmp_path, reference):
    # 20 steps of at least 3 s each cannot fit one minute: the job's end time stops each session in time to
    # push, and the session requeues its own job, until the last one completes the run.
    script, _, store = make_job(tmp_path, prepared_data, time="1")
    job = slurm_cluster.sbatch(script, job_env(pause=3.0))
    end = slurm_cluster.wait(job, JOB_TIMEOUT_S)
    out = (tmp_path / "job.out").read_text()
    assert end["JobState"] == "COMPLETED", out
    records = sessions(store)
    n = len(records)
    assert n >= 2, out
    assert int(end["Restarts"]) == n - 1  # one requeue per session but the last, and no other
    assert [r.slurm_job for r in records] == [job] * n
    assert [r.slurm_restarts for r in records] == list(range(n))
    assert [r.requeued for r in records] == [True] * (n - 1) + [False]
    assert [r.outcome for r in records] == ["stopped: time budget"] * (n - 1) + ["completed"]
    assert records[0].steps_from == 0 and records[-1].steps_to == 20
    for a, b in zip(records, records[1:]):
        assert b.steps_from == a.steps_to > a.steps_from  # each session trained, the next resumed where it ended
        assert a.deadline_ts is not None  # the job's end time was its budget
    assert_same_final_state(store, reference)


def test_usr1_mid_step_checkpoints_requeues_and_resumes_exactly(slurm_cluster, prepared_data, tmp_path, reference):
    # What sbatch --signal=B:USR1@... delivers before the time limit, sent by hand: the batch shell is baton
    # itself (exec), as in examples/slurm/one-node.sbatch.
    script, _, store = make_job(tmp_path, prepared_data, time="10")
    job = slurm_cluster.sbatch(script, job_env(pause=1.0))
    metrics = tmp_path / "runs" / "test" / "metrics.jsonl"
    slurm_cluster.wait(job, JOB_TIMEOUT_S, until=lambda f: metrics.exists() and len(read_metrics(metrics.parent)) >= 3)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)
    end = slurm_cluster.wait(job, JOB_TIMEOUT_S)
    out = (tmp_path / "job.out").read_text()
    assert end["JobState"] == "COMPLETED" and end["Restarts"] == "1", out
    first, last = sessions(store)
    assert first.outcome == "stopped: SIGUSR1" and first.requeued is True
    assert first.checkpoints and first.checkpoints[-1].verified and first.checkpoints[-1].step == first.steps_to
    assert 3 <= first.steps_to < 20
    assert (last.steps_from, last.steps_to, last.outcome, last.requeued) == (first.steps_to, 20, "completed", False)
    assert_same_final_state(store, reference)


def test_an_outside_requeue_checkpoints_and_is_not_requeued_twice(slurm_cluster, prepared_data, tmp_path, reference):
    # A preemption-style requeue: SLURM sends SIGTERM and brings the job back by itself; the session stops with
    # a verified checkpoint and leaves the requeue to SLURM.
    script, _, store = make_job(tmp_path, prepared_data, time="10")
    job = slurm_cluster.sbatch(script, job_env(pause=1.0))
    metrics = tmp_path / "runs" / "test" / "metrics.jsonl"
    slurm_cluster.wait(job, JOB_TIMEOUT_S, until=lambda f: metrics.exists() and len(read_metrics(metrics.parent)) >= 3)
    slurm_cluster.run("scontrol", "requeue", job)
    end = slurm_cluster.wait(job, JOB_TIMEOUT_S)
    out = (tmp_path / "job.out").read_text()
    assert end["JobState"] == "COMPLETED" and end["Restarts"] == "1", out
    first, last = sessions(store)
    assert first.outcome == "stopped: SIGTERM" and first.requeued is False
    assert first.checkpoints and first.checkpoints[-1].verified and first.checkpoints[-1].step == first.steps_to
    assert (last.steps_from, last.steps_to, last.outcome) == (first.steps_to, 20, "completed")
    assert "already" in out  # the session's own account of why it did not requeue
    assert_same_final_state(store, reference)


def test_a_job_that_fails_on_a_config_error_does_not_requeue(slurm_cluster, prepared_data, tmp_path):
    script, _, store = make_job(tmp_path, prepared_data, time="1", args="--set optim.lr=-1")
    job = slurm_cluster.sbatch(script, job_env(pause=0.0))
    end = slurm_cluster.wait(job, JOB_TIMEOUT_S)
    out = (tmp_path / "job.out").read_text()
    assert (end["JobState"], end["ExitCode"], end["Restarts"]) == ("FAILED", "2:0", "0"), out
    assert "baton: error: invalid config: optim.lr must be > 0, got -1.0" in out
    assert not store.exists() or not sessions(store)


def test_the_job_summary_names_the_job(slurm_cluster, prepared_data, tmp_path):
    # --stop-after-steps is a stop the user asked for: no requeue, though the run is not complete.
    script, _, store = make_job(tmp_path, prepared_data, time="5", args="--stop-after-steps 2")
    job = slurm_cluster.sbatch(script, job_env(pause=0.0))
    end = slurm_cluster.wait(job, JOB_TIMEOUT_S)
    assert (end["JobState"], end["Restarts"]) == ("COMPLETED", "0"), (tmp_path / "job.out").read_text()
    summary = json.loads((tmp_path / "runs" / "test" / "run_summary.json").read_text())
    assert summary["slurm"]["job_id"] == job and summary["requeue"] is False
    assert summary["slurm"]["end_ts"] == pytest.approx(float(_epoch(end["EndTime"])))
    (record,) = sessions(store)
    assert (record.slurm_job, record.slurm_restarts, record.requeued) == (job, 0, False)


def _epoch(text: str) -> float:
    from datetime import datetime

    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
