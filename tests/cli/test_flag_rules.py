"""Flags that contradict themselves or the config, each found where it enters: one `baton: error:` line, and the
numbers a plan prints are the ones its inputs mean."""

from __future__ import annotations

import json

import pytest

from support.boundary import assert_input_error, run_in_process


@pytest.fixture(autouse=True)
def crash_logs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _plan(capsys, *argv: str) -> dict:
    o = run_in_process(["plan", *argv, "--json"], capsys)
    assert o.status == 0, o.stderr
    return json.loads(o.stdout)


def test_the_configs_target_is_counted_in_the_plans_tokens_per_step(make_config, capsys):
    cfg = str(make_config())
    target = ["--set", "train.steps=0", "--set", "train.target_tokens=1000000"]
    own = _plan(capsys, "-c", cfg, *target, "--rate", "10000", "--session-hours", "9")
    assert own["total_steps"] == 1_000_000 // 256 and own["target_tokens"] == 1_000_000  # 8 x 32 tokens a step
    wider = _plan(capsys, "-c", cfg, *target, "--tokens-per-step", "2560", "--rate", "10000", "--session-hours", "9")
    assert wider["total_steps"] == 1_000_000 // 2560 and wider["horizon_tokens"] <= 1_000_000


def test_ranks_given_bill_the_run_to_come_not_the_last_session(make_config, baton_cli, capsys):
    cfg = str(make_config())
    assert baton_cli("train", "-c", cfg, "--stop-after-steps", "2", "--no-progress").returncode == 0
    common = ["-c", cfg, "--start-step", "0", "--steps", "1000", "--rate", "100", "--session-hours", "9"]
    one = _plan(capsys, *common)
    four = _plan(capsys, *common, "--ranks", "4")
    assert four["billed_hours"] == pytest.approx(4 * one["billed_hours"], rel=1e-3)
    assert four["wall_hours"] == one["wall_hours"]


@pytest.mark.parametrize("argv, expect", [
    (["--nnodes", "0", "--rdzv-endpoint", "localhost:29555"], "--nnodes 0: nodes must be at least 1"),
    (["--nnodes", "2:1", "--rdzv-endpoint", "localhost:29556"], "--nnodes 2:1: nodes must be at least 1, and MIN at "
                                                                 "most MAX"),
    (["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "29611", "--node-rank", "5"],
     "--node-rank 5 is not a node of --nnodes 2 (0 to 1)"),
])
def test_node_geometry_that_cannot_meet_is_refused_before_any_launch(argv, expect, make_config, capsys):
    assert_input_error(run_in_process(["train", "-c", str(make_config()), *argv], capsys), expect)


def test_preflight_checks_its_flags_before_the_first_stage(make_config, tmp_path, capsys):
    cfg = str(make_config())
    o = run_in_process(["preflight", "-c", cfg, "--out", str(tmp_path / "pf"), "--resume-set", "model.hiden=3"],
                       capsys)
    assert_input_error(o, "--resume-set: invalid config: --set model.hiden")
    assert not (tmp_path / "pf").exists()
    assert_input_error(run_in_process(["preflight", "-c", cfg, "--out", str(tmp_path / "pf"), "--stages", ","],
                                      capsys), "--stages ',' names no stage")


@pytest.mark.parametrize("argv, expect", [
    (["--outage-rate", "1", "--outage-minutes", "1e6"], "longer than a week"),
    (["--outage-rate", "1e6", "--outage-minutes", "10"], "more than one a minute"),
    (["--trace", "ledger"], "--trace ledger reads the run's ledger in its store: give --config"),
])
def test_simulate_inputs_beyond_what_it_can_draw_are_one_line(argv, expect, capsys):
    base = ["simulate", "--target-tokens", "1e8", "--tokens-per-step", "262144", "--session-hours", "9", "--rate",
            "9696", "--ckpt-seconds", "16.5", "--runs", "20"]
    assert_input_error(run_in_process([*base, *argv], capsys), expect)


def test_a_run_named_twice_is_billed_once(make_config, baton_cli, capsys):
    cfg = str(make_config())
    assert baton_cli("train", "-c", cfg, "--stop-after-steps", "2", "--no-progress").returncode == 0
    once = run_in_process(["ledger", "-c", cfg, "--run", "test"], capsys)
    twice = run_in_process(["ledger", "-c", cfg, "--run", "test", "--run", "test"], capsys)
    assert once.status == twice.status == 0 and "over 1 sessions" in once.stdout and once.stdout == twice.stdout


def test_status_says_which_ledger_record_its_billed_total_leaves_out(make_config, baton_cli, tmp_path, capsys):
    cfg = str(make_config())
    assert baton_cli("train", "-c", cfg, "--stop-after-steps", "2", "--no-progress").returncode == 0
    (tmp_path / "store" / "test" / "ledger" / "zz-bad.json").write_text("{not json")
    o = run_in_process(["status", "-c", cfg], capsys)
    assert o.status == 0, o.stderr
    lines = [line for line in o.stdout.splitlines() if line.startswith("ledger problem")]
    assert len(lines) == 1 and "zz-bad.json" in lines[0] and "left out of the billed total" in lines[0]


@pytest.mark.parametrize("env, expect", [
    ({"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29731"},
     "RANK=3 is not a rank of WORLD_SIZE=2 (0 to 1)"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0: a process group has at least one process"),
    ({"RANK": "0", "WORLD_SIZE": "1"}, "but MASTER_ADDR and MASTER_PORT, where the ranks meet, are not"),
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2 is not a rank of LOCAL_WORLD_SIZE=2"),
])
def test_torchrun_variables_that_describe_no_group_are_one_line_not_a_ten_minute_wait(env, expect, make_config,
                                                                                     monkeypatch, capsys):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert_input_error(run_in_process(["train", "-c", str(make_config())], capsys), expect,
                       "unset RANK and WORLD_SIZE to run one process")


@pytest.mark.parametrize("argv, expect", [
    (["--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:70000"], "is not HOST:PORT with a port from 1 to 65535"),
    (["--nnodes", "2", "--rdzv-endpoint", "localhost:abc"], "is not HOST:PORT with a port from 1 to 65535"),
    (["--nnodes", "2", "--rdzv-endpoint", "localhost:29400", "--rdzv-backend", "bogus"],
     "--rdzv-backend 'bogus' is not one of c10d, etcd, etcd-v2, static"),
    (["--nproc", "2", "--set", "train.global_batch=1", "--micro-batch", "auto"],
     "train.global_batch=1 does not split over 2 ranks"),
])
def test_a_launch_torchrun_would_refuse_with_a_traceback_is_one_line_first(argv, expect, make_config, capsys):
    assert_input_error(run_in_process(["train", "-c", str(make_config()), *argv], capsys), expect)


def test_nproc_inside_a_launched_rank_is_refused(make_config, monkeypatch,
                                                 capsys):
    cfg = str(make_config())
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29733"}.items():
        monkeypatch.setenv(k, v)
    assert_input_error(run_in_process(["train", "-c", cfg, "--nproc", "2"], capsys),
                       "--nproc or a multi-node launch given inside a launched rank")


def test_a_slurm_end_time_no_calendar_holds_is_one_line(make_config, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_JOB_END_TIME", "99999999999999")
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol: the environment's end time is all there is
    assert_input_error(run_in_process(["train", "-c", str(make_config())], capsys),
                       "SLURM_JOB_END_TIME=99999999999999 is not a time before the year 9000")


def test_python_dash_m_baton_is_the_baton_command(tmp_path):
    """Where the `baton` script is not on the PATH (a notebook's kernel, a venv not activated)."""
    import subprocess
    import sys

    import baton

    got = subprocess.run([sys.executable, "-m", "baton", "--version"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert (got.returncode, got.stdout.strip()) == (0, f"baton {baton.__version__}"), got.stderr
    bad = subprocess.run([sys.executable, "-m", "baton", "tarin"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("baton: error: argument COMMAND: invalid choice: 'tarin'")


def test_status_says_when_the_folder_store_it_reads_is_not_there(make_config, tmp_path, capsys, monkeypatch):
    """A relative store.url is read from the current directory: run from elsewhere, status would report a run
    with no checkpoint at all, which reads as a lost run. It says the folder is missing, and why that may be."""
    from baton.cli import main

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["status", "-c", str(make_config()), "--set", "store.url=store"]) == 0
    out = capsys.readouterr().out
    assert "pointer: none: no verified checkpoint in the store yet (the next `baton train` starts at step 0 of" in out
    assert (f"store: its folder does not exist yet; if this run has trained before, its store is elsewhere: a relative "
            f"store.url is read from the current directory ({elsewhere}), so run from the folder the run was started "
            "in, or give store.url as an absolute path") in out
    assert not (elsewhere / "store").exists()  # status reads; it creates nothing
    assert main(["status", "-c", str(make_config()), "--set", f"store.url={tmp_path / 'unmounted'}"]) == 0
    assert ("store: its folder does not exist yet; if this run has trained before, is its disk mounted? check "
            "store.url") in capsys.readouterr().out
    (elsewhere / "store").mkdir()
    assert main(["status", "-c", str(make_config()), "--set", "store.url=store"]) == 0
    out = capsys.readouterr().out
    assert "pointer: none: no verified checkpoint in the store yet" in out and "store: its folder" not in out
