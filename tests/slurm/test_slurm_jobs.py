"""Real sbatch jobs of the test config on the one-node cluster (tests/slurm/conftest.py).

Each step of a job pauses a fixed time (``BATON_FAULT_PAUSE=step=S``, before the step runs), so a run lasts
longer than the job's time limit (two minutes) whatever the machine's speed: the sessions a job needs
vary with the machine, what the tests check does not.

Every job is submitted at once (``jobs``) and they run side by side, as on a cluster, so the test takes
about as long as its longest job; a thread sends the outside signals when their jobs are mid-run. One test
then checks each job in turn (``CHECKS``) and reports every check that failed: a single test, so that
pytest-xdist never starts a second cluster on another worker.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from baton.planning.ledger import read_ledger
from baton.store.local import LocalStore
from support.distrun import assert_close_trace, expected_batch_shas
from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors, write_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 900  # a ceiling that catches a hang; a job here takes one to four minutes
# Short enough for a two-minute job: the session stops this long before the job's end time, plus the measured
# step and the checkpoint guess (a second or two for the test model).
BUDGET = """
[budget]
margin_minutes = 0.1
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
EXAMPLES = ROOT / "examples" / "slurm"
# What an example asks and this machine cannot grant (GPUs, 16 cores): left out of the copy a job runs.
NOT_HERE = ("#SBATCH --gpus-per-node", "#SBATCH --cpus-per-task")


def make_config(base: Path, data: Path) -> Path:
    cfg = write_config(base / "cfg.toml", data_dir=data, store=base / "store", runs=base / "runs")
    cfg.write_text(cfg.read_text() + BUDGET)
    return cfg


def make_job(base: Path, data: Path, time: str = "1", args: str = "") -> Path:
    """A job script training the test config into ``base/store`` (config ``base/cfg.toml``)."""
    cfg = make_config(base, data)
    path = base / "job.sh"
    path.write_text(SCRIPT.format(name=base.name, time=time, out=base / "job.out", root=ROOT, python=sys.executable,
                                  cfg=cfg, args=args))
    return path


def example(name: str, base: Path) -> Path:
    """A copy of ``examples/slurm/<name>`` without what this machine cannot grant."""
    lines = (EXAMPLES / name).read_text().splitlines(keepends=True)
    path = base / name
    path.write_text("".join(line for line in lines if not line.startswith(NOT_HERE)))
    return path


def job_env(pause: float) -> dict[str, str]:
    # The examples call `baton`: this interpreter's, importing this checkout.
    return {"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
            "BATON_FAULT_PAUSE": f"step={pause}", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def sessions(store: Path) -> list:
    records, problems = read_ledger(LocalStore(str(store)), "test")
    assert not problems
    return records


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steps_done(base: Path) -> int:
    metrics = base / "runs" / "test" / "metrics.jsonl"
    return len(read_metrics(metrics.parent)) if metrics.exists() else 0


class Jobs:
    """The module's jobs by name: their ids and run folders; ``signalled``: the outside signals sent."""

    def __init__(self, cluster, root: Path, data: Path):
        self.cluster, self.root, self.data = cluster, root, data
        self.ids: dict[str, str] = {}
        self.bases: dict[str, Path] = {}
        self.signalled: dict[str, str] = {}
        self.errors: list[BaseException] = []

    def submit(self, name: str, pause: float, **kw) -> None:
        base = self.bases[name] = self.root / name
        base.mkdir()
        self.ids[name] = self.cluster.sbatch(make_job(base, self.data, **kw), job_env(pause))

    def submit_example(self, name: str, script: str, pause: float, args: tuple[str, ...] = (),
                       options: tuple[str, ...] = (), after: str | None = None) -> None:
        """``examples/slurm/<script>`` as it is (``options`` over its #SBATCH lines); ``after``: a job of the same
        run folder that must end well first (this one resumes from it)."""
        base = self.bases[name] = self.bases[after] if after else self.root / name
        base.mkdir(exist_ok=after is not None)
        cfg = make_config(base, self.data)
        if after:
            options = (*options, f"--dependency=afterok:{self.ids[after]}")
        self.ids[name] = self.cluster.sbatch(example(script, base), job_env(pause), f"--output={base / 'job.out'}",
                                             f"--chdir={ROOT}", *options, args=(str(cfg), *args))

    def base(self, name: str) -> Path:
        return self.bases[name]

    def wait(self, name: str) -> tuple[str, dict[str, str], str]:
        """(job id, the job's final fields, its output) once it ended."""
        end = self.cluster.wait(self.ids[name], JOB_TIMEOUT_S)
        assert not self.errors, self.errors
        return self.ids[name], end, (self.base(name) / "job.out").read_text()

    def signal_mid_run(self, name: str, *cmd: str) -> None:
        """Send ``cmd`` (with the job id appended) once the job trained 3 steps: the signal comes mid-run."""
        def watch():
            try:
                t0 = time.monotonic()
                while steps_done(self.base(name)) < 3:
                    if time.monotonic() - t0 > JOB_TIMEOUT_S:
                        raise AssertionError(f"job {name} never reached step 3")
                    time.sleep(0.2)
                self.cluster.run(*cmd, self.ids[name])
                self.signalled[name] = " ".join(cmd)
            except BaseException as e:  # said by the test that waits for this job
                self.errors.append(e)

        threading.Thread(target=watch, name=f"signal-{name}", daemon=True).start()


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory, prepared_data) -> Jobs:
    j = Jobs(slurm_cluster, tmp_path_factory.mktemp("slurm-jobs"), prepared_data)
    # 20 steps of at least 6 s each cannot fit two minutes: the job's end time stops each session in time to
    # push, and the session requeues its own job, until the last one completes the run. (Two minutes, not
    # SLURM's shortest one: with every job starting at once on two cores, a start alone can take a minute.)
    j.submit("short", pause=6.0, time="2")
    # What the example's --signal=B:USR1@600 delivers before its time limit, sent by hand to the batch shell,
    # which is baton itself (exec).
    j.submit_example("usr1", "one-node.sbatch", pause=0.5)
    j.signal_mid_run("usr1", "scancel", "--signal=USR1", "--batch")
    # A preemption-style requeue from outside: SLURM sends SIGTERM and brings the job back by itself.
    j.submit("outside", pause=0.5, time="10")
    j.signal_mid_run("outside", "scontrol", "requeue")
    j.submit("config-error", pause=0.0, time="1", args="--set optim.lr=-1")
    # --stop-after-steps is a stop the user asked for: no requeue, though the run is not complete.
    j.submit("stop-after", pause=0.0, time="5", args="--stop-after-steps 2")
    # Two srun tasks as two nodes: the first job stops at step 10, the second (after it) resumes to the end.
    # The example's two nodes are two tasks on the one machine here, meeting on a port picked free (the job's
    # own, 29400 + its id mod 1000, may be another process's on a machine the tests share).
    nodes = ("--nodes=1", "--ntasks-per-node=2")
    j.submit_example("nodes", "multi-node.sbatch", pause=0.0, options=nodes,
                     args=("--stop-after-steps", "10", "--rdzv-endpoint", f"x:{free_port()}"))
    j.submit_example("nodes-after", "multi-node.sbatch", pause=0.0, options=nodes, after="nodes",
                     args=("--rdzv-endpoint", f"x:{free_port()}"))
    return j


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prepared_data, baton_cli) -> Path:
    """The run folder (store and runs) of the same run trained in one uninterrupted session, outside SLURM."""
    base = tmp_path_factory.mktemp("slurm-reference")
    cfg = write_config(base / "cfg.toml", data_dir=prepared_data, store=base / "store", runs=base / "runs")
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
    assert_same_final_state(jobs.base("short") / "store", reference)


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
