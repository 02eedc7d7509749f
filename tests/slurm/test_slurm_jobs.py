"""Real sbatch jobs of the test config on the one-node cluster (support/slurm_jobs.py submits them, all at once).

One test checks each job in turn (``CHECKS``) and reports every check that failed: a single test, so that
pytest-xdist never starts a second cluster on another worker.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from baton.planning.ledger import read_ledger
from baton.store.local import LocalStore
from support.distrun import assert_close_trace, expected_batch_shas
from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors, write_config
from support.slurm_jobs import BUDGET, CAMPAIGN_ENV, Jobs, campaign_jobs, submit_all

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def sessions(store: Path) -> list:
    records, problems = read_ledger(LocalStore(str(store)), "test")
    assert not problems
    return records


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory, prepared_data) -> Jobs:
    if CAMPAIGN_ENV in os.environ:  # submitted by pytest-xdist's controller as the suite started
        jobs = campaign_jobs(Path(os.environ[CAMPAIGN_ENV]))
        assert isinstance(jobs, Jobs)  # slurm_cluster skipped the test otherwise
        return jobs
    return submit_all(Jobs(slurm_cluster, tmp_path_factory.mktemp("slurm-jobs"), prepared_data))


@pytest.fixture(scope="module")
def reference(jobs, tmp_path_factory, baton_cli) -> Path:
    """The run folder (store and runs) of the same run trained in one uninterrupted session, outside SLURM."""
    base = tmp_path_factory.mktemp("slurm-reference")
    cfg = write_config(base / "cfg.toml", data_dir=jobs.data, store=base / "store", runs=base / "runs")
    cfg.write_text(cfg.read_text() + BUDGET)
    baton_cli("train", "--config", str(cfg), "--no-progress", check=True)
    return base


def assert_same_final_state(store: Path, reference: Path) -> None:
    model, optim, pointer = store_checkpoint_tensors(store, "test")
    ref_model, ref_optim, ref_pointer = store_checkpoint_tensors(reference / "store", "test")
    assert pointer["step"] == ref_pointer["step"] == 20 and pointer["complete"] is True
    assert_tensors_equal(model, ref_model)
    assert_tensors_equal(optim, ref_optim)


def check_a_job_shorter_than_the_run_requeues_itself_until_the_run_is_complete(jobs, reference):
    job, end, out = jobs.wait("short")
    assert end["JobState"] == "COMPLETED", out
    records = sessions(jobs.base("short") / "store")
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
    assert_each_session_released_the_run(records, jobs.base("short") / "store")
    assert_same_final_state(jobs.base("short") / "store", reference)


def assert_each_session_released_the_run(records: list, store: Path) -> None:
    """A requeued or signalled job released the run's lease as it ended: the next job took it at once, no takeover
    (a lease left held would have been taken over as "gone" or after its expiry), each a new epoch, and the last
    left it released."""
    assert [r.took_over for r in records] == [None] * len(records)
    assert [r.epoch for r in records] == list(range(1, len(records) + 1))
    lease = json.loads((store / "test" / "lease").read_text())
    assert lease["released"] is True and lease["epoch"] == records[-1].epoch


def assert_ended_on_a_verified_checkpoint(session) -> None:
    """A stopped session's last checkpoint is verified and at the step it stopped at: the next one resumes there."""
    assert session.checkpoints and session.checkpoints[-1].verified
    assert session.checkpoints[-1].step == session.steps_to


def check_usr1_mid_run_checkpoints_requeues_and_resumes_exactly(jobs, reference):
    job, end, out = jobs.wait("usr1")
    assert jobs.signalled["usr1"] == "scancel --signal=USR1 --batch"
    assert end["JobState"] == "COMPLETED" and end["Restarts"] == "1", out
    first, last = sessions(jobs.base("usr1") / "store")
    assert first.outcome == "stopped: SIGUSR1" and first.requeued is True
    assert_ended_on_a_verified_checkpoint(first)
    assert 3 <= first.steps_to < 20
    assert (last.steps_from, last.steps_to, last.outcome, last.requeued) == (first.steps_to, 20, "completed", False)
    assert_each_session_released_the_run([first, last], jobs.base("usr1") / "store")
    assert_same_final_state(jobs.base("usr1") / "store", reference)


def check_an_outside_requeue_checkpoints_and_is_not_requeued_twice(jobs, reference):
    job, end, out = jobs.wait("outside")
    assert jobs.signalled["outside"] == "scontrol requeue"
    assert end["JobState"] == "COMPLETED" and end["Restarts"] == "1", out
    first, last = sessions(jobs.base("outside") / "store")
    assert first.outcome == "stopped: SIGTERM" and first.requeued is False
    assert_ended_on_a_verified_checkpoint(first)
    assert (last.steps_from, last.steps_to, last.outcome) == (first.steps_to, 20, "completed")
    assert f"SLURM job {job}: no requeue (SLURM requeued job {job} already (Restarts=1))" in out
    assert_each_session_released_the_run([first, last], jobs.base("outside") / "store")
    assert_same_final_state(jobs.base("outside") / "store", reference)


def check_a_job_that_fails_on_a_config_error_does_not_requeue(jobs, reference):
    job, end, out = jobs.wait("config-error")
    assert (end["JobState"], end["ExitCode"], end["Restarts"]) == ("FAILED", "2:0", "0"), out
    assert "baton: error: invalid config: optim.lr must be > 0, got -1.0" in out
    store = jobs.base("config-error") / "store"
    assert not store.exists() or not sessions(store)


def check_a_stop_the_user_asked_for_does_not_requeue_and_the_summary_names_the_job(jobs, reference):
    job, end, out = jobs.wait("stop-after")
    assert (end["JobState"], end["Restarts"]) == ("COMPLETED", "0"), out
    summary = json.loads((jobs.base("stop-after") / "runs" / "test" / "run_summary.json").read_text())
    assert summary["slurm"]["job_id"] == job and summary["requeue"] is False
    # Its time limit from its start (after the job ended, EndTime says when it did).
    assert summary["slurm"]["end_ts"] == _epoch(end["StartTime"]) + 5 * 60
    (record,) = sessions(jobs.base("stop-after") / "store")
    assert (record.slurm_job, record.slurm_restarts, record.requeued, record.steps_to) == (job, 0, False, 2)


def check_two_srun_tasks_train_and_resume_as_two_nodes(jobs, reference):
    job, end, out = jobs.wait("nodes")
    assert end["JobState"] == "COMPLETED", out
    assert re.search(rf"--rdzv-endpoint {end['BatchHost']}:\d+ --rdzv-id slurm-{job} ", out)
    base = jobs.base("nodes")
    first = sessions(base / "store")[0]
    assert (first.slurm_job, first.accelerators, first.steps_to, first.requeued) == (job, 2, 10, False)
    # The second job: the same example without --stop-after-steps, resumed from the store by both nodes.
    second, end, out = jobs.wait("nodes-after")
    assert end["JobState"] == "COMPLETED", out
    rows = read_metrics(base / "runs" / "test")
    assert [r["batch_sha"] for r in rows] == expected_batch_shas(jobs.data, 20)
    assert_close_trace(rows, read_metrics(reference / "runs" / "test"))
    pointer = json.loads((base / "store" / "test" / "latest.json").read_text())
    assert pointer["step"] == 20 and pointer["complete"] is True
    assert [(r.slurm_job, r.steps_from, r.steps_to) for r in sessions(base / "store")] == [(job, 0, 10),
                                                                                        (second, 10, 20)]
    assert sorted(p.name for p in (base / "runs" / "test" / "logs").glob("rank-*.log")) == ["rank-0.log", "rank-1.log"]


CHECKS = (
    check_a_job_shorter_than_the_run_requeues_itself_until_the_run_is_complete,
    check_usr1_mid_run_checkpoints_requeues_and_resumes_exactly,
    check_an_outside_requeue_checkpoints_and_is_not_requeued_twice,
    check_a_job_that_fails_on_a_config_error_does_not_requeue,
    check_a_stop_the_user_asked_for_does_not_requeue_and_the_summary_names_the_job,
    check_two_srun_tasks_train_and_resume_as_two_nodes,
)


def test_sbatch_jobs_on_a_real_cluster(jobs, reference):
    failed = []
    for check in CHECKS:
        try:
            check(jobs, reference)
        except AssertionError as e:
            failed.append(f"{check.__name__}: {e}")
    assert not failed, "\n\n".join(failed)


def _epoch(text: str) -> float:
    from datetime import datetime

    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
