"""SLURM awareness without a cluster: the job's environment, scontrol's text, the requeue decision, time limits.

The same paths run against a real slurmctld in tests/slurm/.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from baton.config import load_config
from baton.errors import BatonError, ConfigError
from baton.planning.ledger import LedgerRecord
from baton.planning.plan import parse_hours, parse_time_limit
from baton.runtime import slurm
from baton.runtime.launch import LaunchSpec, torchrun_command
from baton.session.clock import StopSignals, session_clock

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "records"

# `scontrol show job 7` of a running requeued batch job (slurm 22.05), as printed without -o.
SHOW_JOB = """JobId=7 JobName=train.sbatch
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=4294901759 Nice=0 Account=(null) QOS=(null)
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=2 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:00:12 TimeLimit=2-00:00:00 TimeMin=N/A
   SubmitTime=2026-12-02T00:56:47 EligibleTime=2026-12-02T00:58:48
   StartTime=2026-12-02T00:58:48 EndTime=2026-12-04T00:58:48 Deadline=N/A
   Command=/home/me/run files/train.sbatch
   WorkDir=/home/me/run files
"""


def test_the_jobs_environment_is_read_into_a_record():
    env = {"SLURM_JOB_ID": "812", "SLURM_ARRAY_JOB_ID": "800", "SLURM_ARRAY_TASK_ID": "12",
           "SLURM_RESTART_COUNT": "3", "SLURM_JOB_END_TIME": "1796173007", "SLURM_JOB_NODELIST": "gpu[01-02]",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_PROCID": "1"}
    job = slurm.current_job(env, query=False)
    assert job == slurm.SlurmJob(job_id="812", array_job_id="800", array_task_id=12, restart_count=3,
                                 end_ts=1796173007.0, node_list="gpu[01-02]", num_nodes=2, proc_id=1)
    assert slurm.current_job({}, query=False) is None
    # A first run has no SLURM_RESTART_COUNT, and SLURM before 23.02 no SLURM_JOB_END_TIME.
    assert slurm.current_job({"SLURM_JOB_ID": "5"}, query=False) == slurm.SlurmJob(job_id="5")


@pytest.mark.parametrize("env, message", [
    ({"SLURM_JOB_ID": "x5"}, "the environment variable SLURM_JOB_ID='x5' is not a job id"),
    ({"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "one"},
     "the environment variable SLURM_RESTART_COUNT='one' is not a whole number"),
])
def test_a_damaged_job_environment_is_one_line(env, message):
    with pytest.raises(BatonError) as e:
        slurm.current_job(env, query=False)
    assert str(e.value).startswith(message)


def test_scontrol_show_job_is_parsed_with_values_that_hold_spaces():
    fields = slurm.parse_show_job(SHOW_JOB)
    assert fields["JobState"] == "RUNNING" and fields["Restarts"] == "2" and fields["BatchFlag"] == "1"
    assert fields["Command"] == "/home/me/run files/train.sbatch"
    assert fields["WorkDir"] == "/home/me/run files"
    assert fields["TimeLimit"] == "2-00:00:00"
    # scontrol writes local time without a zone: read back as this machine's local time.
    assert slurm.end_time(fields) == datetime(2026, 12, 4, 0, 58, 48).timestamp()
    assert slurm.parse_show_job(" ".join(SHOW_JOB.split())) == fields  # the one-line form (-o)
    assert slurm.end_time({**fields, "TimeLimit": "UNLIMITED"}) is None
    assert slurm.end_time({**fields, "EndTime": "Unknown"}) is None


JOB = slurm.SlurmJob(job_id="7", restart_count=2)


@pytest.mark.parametrize("mode, cap, job, stopped_by, step, wanted, why", [
    ("auto", 20, JOB, "time budget", 10, True, "stopped for time budget at step 10 of 20"),
    ("auto", 20, JOB, "SIGUSR1", 10, True, "stopped for SIGUSR1 at step 10 of 20"),
    ("auto", 20, JOB, "time budget", 20, False, "the run is complete"),
    ("auto", 20, JOB, None, 10, False, "the session stopped at --stop-after-steps, as asked"),
    ("off", 20, JOB, "time budget", 10, False, "train.requeue is off"),
    ("auto", 2, JOB, "time budget", 10, False, "the job was requeued 2 times already, train.max_requeues=2"),
    ("auto", 3, JOB, "time budget", 10, True, "stopped for time budget"),
    ("auto", 20, None, "time budget", 10, False, "not a SLURM job"),
    ("auto", 20, slurm.SlurmJob(job_id="7", batch=False), "SIGTERM", 10, False, "not a batch job"),
    # Its start took the whole budget: the next run of the job would too.
    ("auto", 20, JOB, "time budget", 4, False, "the session trained no step (it stopped at step 4 for time budget)"),
])
def test_the_requeue_decision(mode, cap, job, stopped_by, step, wanted, why):
    got, reason = slurm.requeue_decision(mode, cap, job, stopped_by, step, 20, first_step=4)
    assert got is wanted and reason.startswith(why)


def test_each_job_has_its_own_rendezvous_port_below_the_ephemeral_range():
    assert [slurm.rendezvous_port(j) for j in ("7", "1007", "123999")] == [29407, 29407, 30399]


def test_a_job_slurm_brings_back_itself_is_not_requeued_again():
    running = slurm.parse_show_job(SHOW_JOB)
    assert slurm.already_requeued(JOB, running) is None
    assert slurm.already_requeued(JOB, {**running, "Restarts": "3"}) == "SLURM requeued job 7 already (Restarts=3)"
    assert slurm.already_requeued(JOB, {**running, "JobState": "PENDING"}) == "job 7 is PENDING already"
    # scancel: the person ended the job; a requeue would undo it
    assert slurm.already_requeued(JOB, {**running, "JobState": "CANCELLED by 0"}) == \
        "job 7 is CANCELLED by 0: it was cancelled, and stays so"


@pytest.mark.parametrize("text, hours", [
    ("2-00:00:00", 48.0), ("1-12", 36.0), ("1-12:30", 36.5), ("12:00:00", 12.0), ("90:00", 1.5), ("0:30", 0.5 / 60),
    ("1:30:00", 1.5),
])
def test_slurm_time_limits_are_durations(text, hours):
    assert parse_time_limit(text) == pytest.approx(hours)
    assert parse_hours(text, "--session-hours") == pytest.approx(hours)  # plan, simulate and train take them


def test_a_time_limit_that_is_not_one_is_refused():
    with pytest.raises(BatonError) as e:
        parse_time_limit("UNLIMITED")
    assert str(e.value) == ("time limit 'UNLIMITED' is not a SLURM time limit (examples: 2-00:00:00, 1-12, "
                            "12:00:00, 90:00)")
    with pytest.raises(BatonError, match="is not a duration"):
        parse_hours("1:2:3:4", "--session-hours")


def test_the_plan_takes_a_slurm_time_limit_as_the_session_length(capsys):
    from baton.cli import main

    outs = []
    for hours in ("2-00:00:00", "48"):
        assert main(["plan", "--target-tokens", "1e9", "--tokens-per-step", "262144", "--rate", "10000",
                     "--session-hours", hours, "--start", "2026-12-01T00:00Z"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "sessions of 48 h" in outs[0]


def test_the_jobs_end_time_is_the_budget_unless_session_hours_says_otherwise(monkeypatch):
    cfg = load_config(None)
    end = time.time() + 3600
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(end)))
    monkeypatch.setattr(slurm, "show_job", lambda job_id, strict=True: {})  # no controller here
    assert session_clock(cfg, None, None, None)[1] == int(end)
    started, stop = session_clock(cfg, None, "0.5", None)
    assert stop == started + 1800
    cfg.budget.session_hours = 0.25
    started, stop = session_clock(cfg, None, None, None)
    assert stop == started + 900
    cfg.budget.session_hours = 0.0
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time() + 60)))  # ends inside the 5 min margin
    with pytest.raises(BatonError, match="too soon"):
        session_clock(cfg, None, None, None)


def test_the_warning_signal_is_a_stop_signal_where_configured():
    stop = StopSignals((slurm.warning_signal("SIGUSR2"),))
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert stop.signum == signal.SIGUSR2
    finally:
        stop.restore()
    cmd = torchrun_command(LaunchSpec(nproc=2), [], signals=(signal.SIGUSR2,))
    if "--signals-to-handle" in cmd:  # torch >= 2.9
        assert cmd[cmd.index("--signals-to-handle") + 1].split(",")[-1] == "SIGUSR2"


def test_a_torchrun_that_cannot_handle_the_warning_signal_is_sent_sigterm(monkeypatch):
    """torchrun before --signals-to-handle dies of SIGUSR1 (SLURM's warning), orphaning the ranks with no
    checkpoint: the launcher passes it on as SIGTERM, which the ranks take as the same stop."""
    from baton.runtime import launch

    monkeypatch.setattr(launch, "_torchrun_options", lambda: frozenset({"--nproc-per-node"}))
    assert launch.passed_on(signal.SIGUSR1) == signal.SIGTERM
    assert launch.passed_on(signal.SIGUSR2) == signal.SIGTERM
    assert [launch.passed_on(s) for s in launch.TORCHRUN_DEFAULT_SIGNALS] == list(launch.TORCHRUN_DEFAULT_SIGNALS)
    monkeypatch.setattr(launch, "_torchrun_options", lambda: frozenset({"--signals-to-handle"}))
    assert launch.passed_on(signal.SIGUSR1) == signal.SIGUSR1


@pytest.mark.parametrize("override, problem", [
    ("train.requeue=always", "train.requeue='always' is not one of auto, off"),
    ("train.max_requeues=-1", "train.max_requeues must be >= 0, got -1"),
    ("train.slurm_signal=KILL", "train.slurm_signal='KILL' is not one of USR1, USR2, TERM, INT, HUP"),
])
def test_bad_slurm_settings_are_config_errors(override, problem):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value).startswith(f"invalid config: {problem}")


def test_ledger_records_keep_the_job_and_old_records_still_load():
    old = LedgerRecord.from_json(json.loads((ASSETS / "ledger-v1.json").read_text()))
    assert (old.slurm_job, old.slurm_array_task, old.slurm_restarts, old.requeued) == (None, None, None, False)
    new = LedgerRecord(session="s", run="r", started_ts=1.0, slurm_job="812", slurm_array_task=3, slurm_restarts=2,
                       requeued=True)
    assert LedgerRecord.from_json(json.loads(json.dumps(new.to_json()))) == new
    for key, value, message in (("slurm_restarts", "2", "slurm_restarts is not a whole number"),
                                ("slurm_job", 812, "slurm_job is not a job id"),
                                ("requeued", "yes", "requeued is not true or false")):
        with pytest.raises(ValueError, match=message):
            LedgerRecord.from_json({**new.to_json(), key: value})
