"""Time budgets and preemption, end to end: the session stops at a step boundary in time, with a verified
checkpoint, exits 0, and the next session continues from it."""

import json
import signal
import subprocess
import sys
import time

import pytest

from baton.hashing import sha256_file
from baton.session.clock import TimeBudget
from support.helpers import read_metrics

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
# Seconds of the budget left for training, checkpoints by the clock and the stop margin once started.
TRAIN_S = 8


def _budget_s() -> float:
    """A session budget that leaves steps to train after the start-up, however loaded the machine is now:
    the clock starts with the process, so importing the training stack is spent from the budget. Three times
    the import measured now covers the start-up (import, data, model) even if the load grows meanwhile; the
    training window itself stays fixed, so a loaded machine does not lengthen it."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import baton.session.core, baton.loop"], cwd=ROOT, check=True)
    return 3 * (time.monotonic() - t0) + TRAIN_S


def _ledger(store, run="test"):
    return [json.loads(p.read_text()) for p in sorted((store / run / "ledger").glob("*.json"))]


def _assert_pointer_verified(store, run="test"):
    """The pointer's checkpoint is in the store byte for byte as the pointer describes it."""
    pointer = json.loads((store / run / "latest.json").read_text())
    folder = store / run / pointer["path"]
    for name, info in pointer["files"].items():
        assert (folder / name).stat().st_size == info["size"] and sha256_file(folder / name) == info["sha256"]
    return pointer


def test_time_budget_stops_in_time_and_the_next_session_continues(make_config, baton_cli, tmp_path):
    cfg = str(make_config())
    store, run_dir = tmp_path / "store", tmp_path / "runs" / "test"
    budget = round(_budget_s())
    t_launch = time.time()
    # A horizon far beyond the budget; checkpoints every 0.6 s by the clock, none by step count.
    first = baton_cli("train", "-c", cfg, "--no-progress", "--session-hours", f"{budget}s",
                      "--set", "train.steps=1000000", "--set", "budget.margin_minutes=0.04",
                      "--set", "budget.ckpt_minutes=0.01", "--set", "budget.ckpt_seconds=1", check=True,
                      fresh=True,  # a new interpreter: the clock must start before the imports
                      # Each step waits a fifth of a second before it runs: the budget is spent waiting, not on
                      # thousands of steps that take a core from the tests beside this one.
                      env={"BATON_FAULT_PAUSE": "step=0.2"})
    summary = json.loads((run_dir / "run_summary.json").read_text())
    n = summary["steps_done"]
    assert summary["stopped_by"] == "time budget" and 0 < n < 1_000_000
    assert f"stopping at step {n}: time budget" in first.stderr
    pointer = _assert_pointer_verified(store)
    assert pointer["step"] == n and read_metrics(run_dir)[-1]["step"] == n

    (rec,) = _ledger(store)
    assert rec["outcome"] == "stopped: time budget" and rec["steps_to"] == n
    # The clock starts with the process, before Python imported anything, and the end is inside the budget.
    assert rec["started_ts"] <= t_launch + 1.0
    assert rec["deadline_ts"] == pytest.approx(rec["started_ts"] + budget)
    assert rec["ended_ts"] <= rec["deadline_ts"]
    assert rec["checkpoints"][-1] == {**rec["checkpoints"][-1], "step": n, "verified": True}
    timed = rec["checkpoints"][:-1]
    assert timed, "budget.ckpt_minutes produced no checkpoint by the clock"
    assert all(c["verified"] for c in timed) and [c["step"] for c in timed] == sorted({c["step"] for c in timed})

    second = baton_cli("train", "-c", cfg, "--no-progress", "--set", "train.steps=1000000",
                       "--stop-after-steps", str(n + 5), check=True)
    assert "auto-resume" in second.stderr and f"step {n}" in second.stderr
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["resumed_from_step"] == n and summary["steps_done"] == n + 5
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, n + 6))
    assert _assert_pointer_verified(store)["step"] == n + 5
    outcomes = [r["outcome"] for r in _ledger(store)]
    assert sorted(outcomes) == sorted(["stopped: time budget", f"stopped at step {n + 5} (--stop-after-steps)"])


def test_sigterm_checkpoints_at_the_next_boundary_and_exits_0(make_config, baton_cli, tmp_path):
    cfg = str(make_config())
    store, run_dir = tmp_path / "store", tmp_path / "runs" / "test"
    proc = baton_cli.start("train", "-c", cfg, "--no-progress", "--set", "train.steps=1000000")
    deadline = time.time() + 120
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 30):
        assert proc.poll() is None and time.time() < deadline, "training did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    done = proc.wait(timeout=60)
    err = done.stderr
    assert done.returncode == 0, err
    summary = json.loads((run_dir / "run_summary.json").read_text())
    n = summary["steps_done"]
    assert summary["stopped_by"] == "SIGTERM" and n >= 30
    assert "received SIGTERM" in err and f"stopping at step {n}: SIGTERM" in err
    assert _assert_pointer_verified(store)["step"] == n == read_metrics(run_dir)[-1]["step"]
    assert summary["checkpoints"][-1]["step"] == n and summary["checkpoints"][-1]["verified"]
    (rec,) = _ledger(store)
    assert rec["outcome"] == "stopped: SIGTERM" and rec["ended_ts"] and rec["steps_to"] == n

    baton_cli("train", "-c", cfg, "--no-progress", "--set", "train.steps=1000000", "--stop-after-steps",
              str(n + 3), check=True)
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["resumed_from_step"] == n and summary["steps_done"] == n + 3


def test_sigterm_while_the_data_is_pulled_ends_the_session_cleanly(make_config, baton_cli, tmp_path):
    """A preemption during the start-up (here: while the data is pulled from data.url, held at the data.pull
    point) used to kill the process at once (exit -15, no ledger end). The flag is now set from the start:
    the session stops at its first boundary, bills the start-up and exits 0."""
    from baton.config import load_config
    from baton.data.publish import publish

    cfg_path = make_config()
    url = tmp_path / "relay"
    publish(load_config(cfg_path, [f'data.url="{url}"']))
    trace = tmp_path / "trace"
    env = {"BATON_FAULT_PAUSE": "data.pull=1", "BATON_FAULT_TRACE": str(trace)}
    proc = baton_cli.start("train", "-c", str(cfg_path), "--no-progress", "--set", f'data.url="{url}"',
                           "--set", f'data.dir="{tmp_path / "fresh-data"}"', env=env)
    deadline = time.time() + 120
    while not (trace.exists() and trace.read_text().strip()):
        assert proc.poll() is None and time.time() < deadline, "the data pull did not start"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    done = proc.wait(timeout=120)
    err = done.stderr
    assert done.returncode == 0, err[-3000:]
    assert "received SIGTERM" in err and "stopping at step 0: SIGTERM" in err
    (rec,) = _ledger(tmp_path / "store")
    assert rec["outcome"] == "stopped: SIGTERM" and rec["ended_ts"] > rec["started_ts"] and rec["steps_to"] == 0
    assert not (tmp_path / "store" / "test" / "latest.json").exists()


# The session's handler, in a process of its own: a repeat within the duplicate window is the same
# request; a later second signal ends the process at once.
HANDLER = """
import os, signal, time
from baton.session.clock import StopSignals
signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup: stays ignored
s = StopSignals()
s.install()
assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
os.kill(os.getpid(), signal.SIGTERM)
assert s.signum == signal.SIGTERM
os.kill(os.getpid(), signal.SIGINT)  # a second delivery right away: ignored
print("flag set, duplicate ignored", flush=True)
time.sleep(2.2)
os.kill(os.getpid(), signal.SIGUSR1)  # a real second request
time.sleep(5)
print("still alive", flush=True)
"""


def test_second_signal_exits_at_once():
    p = subprocess.run([sys.executable, "-c", HANDLER], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.stdout.splitlines() == ["flag set, duplicate ignored"], p.stderr
    assert p.returncode == -signal.SIGUSR1


def test_budget_arithmetic():
    b = TimeBudget(deadline=1000.0, margin_s=30.0, ckpt_guess_s=60.0, ckpt_every_s=300.0, start=0.0, eval_steps=1.0)
    assert not b.should_stop(900.0)  # 900 + 0 (no step measured yet) + 60 + 30 = 990 <= 1000
    b.observe_step(5.0)
    b.observe_step(8.0)
    assert b.step_estimate == 8.0 and b.stepping_seconds == 13.0
    assert b.should_stop(903.0)  # 903 + 8 + 60 + 30 = 1001 > 1000
    assert not b.should_stop(902.0)
    b.observe_checkpoint(20.0, at=500.0)  # measured: replaces the guess
    assert b.ckpt_estimate == 20.0 and not b.should_stop(940.0) and b.should_stop(943.0)
    assert b.should_stop(923.0 - 8.0, final=True)  # at the horizon: the evaluation and the export's push too
    assert not b.should_stop(922.0 - 8.0, final=True)
    assert b.should_stop(923.0, in_flight=True)  # a background push to wait for before the last one
    assert not b.checkpoint_due(799.0) and b.checkpoint_due(800.0)
    assert not TimeBudget(None, 0, 0).should_stop(1e12)


def test_launch_passes_the_launchers_clock_to_every_rank(make_config):
    from baton.api import rank_args
    from baton.cli import build_parser
    from baton.config import load_config
    from baton.session.clock import session_clock

    cfg = load_config(make_config())
    t0 = time.time()
    started, deadline = session_clock(cfg, None, "90m", None)
    assert started <= t0 and deadline == started + 5400
    argv = rank_args(cfg, "auto", None, started, deadline, (), True)
    assert "--session-hours" not in argv and "--nproc" not in argv
    assert float(argv[argv.index("--session-start") + 1]) == started
    # A rank parses the same instants back: its clock is the launcher's, not its own later start.
    a = build_parser().parse_args(["train", *argv])
    rank_cfg = load_config(a.config, a.overrides)
    assert rank_cfg.to_dict() == cfg.to_dict()
    assert session_clock(rank_cfg, a.session_start, a.session_hours, a.deadline) == (
        started, pytest.approx(deadline, abs=1e-5))


def test_a_budget_that_cannot_train_a_step_is_refused_before_the_session(make_config):
    """--session-hours 0 used to mean no budget at all, and a deadline already past (often a time zone left
    out) started a session that billed only to stop at step 0. Both are one line now; a launched rank, whose
    clock the launcher checked, is not refused."""
    from baton.config import load_config
    from baton.errors import BatonError
    from baton.session.clock import session_clock

    cfg = load_config(make_config())
    for hours, deadline, expect in [(0, None, "--session-hours must be > 0"),
                                    ("0", None, "--session-hours must be > 0"),
                                    (None, "2020-01-01T00:00Z", "2020-01-01T00:00:00Z, already past"),
                                    # counted from this (long-lived) process's start: too soon, or already past
                                    ("0.01", None, "nothing can train before the 5 min margin")]:
        with pytest.raises(BatonError, match=expect):
            session_clock(cfg, None, hours, deadline)
    assert session_clock(cfg, 1.0, None, "2020-01-01T00:00Z") == (1.0, 1577836800.0)
    now = time.time()
    started, stop_at = session_clock(cfg, None, None, "2099-01-01T01:00+01:00")
    assert started <= now and stop_at == 4070908800.0


def test_a_timed_checkpoint_is_not_due_while_the_last_one_is_still_pushing(make_config, baton_cli, tmp_path):
    """budget.ckpt_minutes with background pushes: the cadence runs from when a checkpoint began, and none is due
    while one is in flight. Each push here takes over 2 s (a pause at its verification) against a 0.3 s cadence and
    steps of a few hundredths: training goes on during each push, so no two timed checkpoints are a step apart (they
    were: the next one was due at once, and waited for the push, step after step)."""
    cfg = str(make_config())
    store = tmp_path / "store"
    baton_cli("train", "-c", cfg, "--no-progress", "--set", "train.steps=1000000", "--stop-after-steps", "150",
              "--set", "budget.ckpt_minutes=0.005", "--set", "store.keep_last=100", check=True,
              env={"BATON_FAULT_PAUSE": "step=0.02,verify=2.0"})
    (rec,) = _ledger(store)
    steps = [c["step"] for c in rec["checkpoints"]]
    assert len(steps) >= 3 and steps[-1] == 150, steps
    assert all(b - a >= 2 for a, b in zip(steps, steps[1:])), steps


@pytest.mark.parametrize("point", ["session.start", "session.closed"])
def test_a_stop_signal_outside_the_session_exits_0(point, make_config, baton_cli, tmp_path):
    """Before the session listens (the process still starting) a SIGTERM is handed to it: it stops at its first
    boundary. After it closed (the run complete, the summary being printed) the work is done. Either ended the
    process at once with status 143."""
    cfg = str(make_config())
    trace = tmp_path / "trace"
    proc = baton_cli.start("train", "-c", cfg, "--no-progress",
                           env={"BATON_FAULT_PAUSE": f"{point}=2", "BATON_FAULT_TRACE": str(trace)})
    deadline = time.time() + 240
    while not (trace.exists() and any(line.split()[0] == point for line in trace.read_text().splitlines())):
        assert proc.poll() is None and time.time() < deadline, f"{point} was not reached"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    done = proc.wait(timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "test" / "run_summary.json").read_text())
    if point == "session.start":
        assert summary["stopped_by"] == "SIGTERM" and summary["steps_done"] == 0
        assert "received SIGTERM while starting: will stop at the first step boundary" in done.stderr
    else:
        assert summary["steps_done"] == summary["total_steps"] and "final validation:" in done.stdout


def test_a_stop_step_the_run_has_passed_trains_nothing_and_says_so(make_config, capsys):
    """An earlier session's command run again (`--stop-after-steps 2` with the run at step 4): nothing to train,
    exit as a stopped session, and one line naming what to give instead, not a silent success."""
    from baton.config import load_config
    from baton.loop import run

    cfg = load_config(make_config(), ["train.steps=8"])
    run(cfg, stop_after=4, progress=False)
    capsys.readouterr()
    summary = run(cfg, stop_after=2, progress=False)
    assert summary["steps_done"] == 4
    assert ("nothing to train: the run is at step 4, and this session stops at step 2 (--stop-after-steps): give a "
            "later step, or leave it out to train on to the horizon (8)") in capsys.readouterr().err


def test_a_second_interrupt_in_a_notebook_ends_the_cell_not_the_kernel():
    """Where the process has a Python handler for the signal (Python's own SIGINT handler, a notebook kernel's),
    the second stop signal is handed to it: KeyboardInterrupt in the cell. Before, it restored the default action
    and killed the process: the kernel, and every variable in the notebook, lost."""
    import os

    from baton.session.clock import StopSignals

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    stop = StopSignals()
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGINT  # the first: a checkpoint at the next boundary
        stop.at -= 60  # the second comes later than a duplicate would
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler runs between bytecodes: it has raised long before this ends
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
