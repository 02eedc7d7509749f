"""A rank that fails, a launcher that is signalled, and the launcher's command line."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

from baton.runtime.agent import user_error_only
from baton.runtime.launch import LaunchSpec, parse_rank_log, torchrun_command
from support.distrun import ROOT, baton_train, rank_env
from support.helpers import write_config

# Gloo notices a dead peer as soon as its socket closes and torchrun tears the group down on the first
# failed worker; the collective timeout (train.dist_timeout) is only the last resort. It is set far past
# the run's own ceiling (distrun.RUN_TIMEOUT_S), so a failure noticed only through it fails the test as a
# hang, whatever the machine's speed.
DIST_TIMEOUT_S = 7200


def test_one_rank_failing_stops_every_rank_and_the_launcher_prints_its_traceback(runs):
    run = runs.train("fault", "--nproc", "2", "--set", "train.steps=200", "--set",
                     f"train.dist_timeout={DIST_TIMEOUT_S}", env={"BATON_FAULT_AT": "1:3"}, expect_ok=False)
    assert run.proc.returncode != 0
    # Every process ended through its own error path, non-zero, with the record in its own log.
    for rank in (0, 1):
        status = re.search(rf"EXIT rank={rank} status=(-?\d+)$", run.log(rank), re.M)
        assert status and int(status.group(1)) != 0, run.log(rank)
    # The failing rank's own traceback is in its log, in full ...
    log1 = run.log(1)
    assert "Traceback (most recent call last):" in log1
    assert "injected failure on rank 1 at step 3" in log1
    assert 'baton/loop.py", line' in log1  # the frames, not only the last line
    # ... and in the launcher's report, which names rank 1 as the first to fail.
    report = run.proc.stderr[run.proc.stderr.index("baton: the distributed run failed"):]
    section1 = report[report.index("--- rank 1:"):]
    assert "first to fail" in section1.splitlines()[0]
    assert "Traceback (most recent call last):" in section1
    assert "RuntimeError: injected failure on rank 1 at step 3" in section1
    # Rank 0 is reported too, with what ended it (the dead peer), so nothing is hidden.
    section0 = report[report.index("--- rank 0:"):report.index("--- rank 1:")]
    assert "Traceback (most recent call last):" in section0
    # No checkpoint was ever verified, so nothing claims one.
    assert not (run.store / "test" / "latest.json").exists()


def test_a_user_error_in_the_ranks_is_one_line_without_torchruns_report(tmp_path):
    """Found only by the ranks (the data folder is missing): baton's one line, not torchrun's traceback too."""
    cfg = write_config(tmp_path / "cfg.toml", data_dir=tmp_path / "no-data", store=tmp_path / "store",
                       runs=tmp_path / "runs")
    p = baton_train(cfg, "--nproc", "2")
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "Traceback" not in out and "ChildFailedError" not in out and "exitcode" not in out, out
    line = (f"baton: error: data folder {tmp_path / 'no-data'} does not exist (run `baton prepare --config ...` "
            "first)")
    assert [x for x in out.splitlines() if "baton: error:" in x] == [line], out  # once, not once per rank
    assert p.stderr.rstrip("\n").splitlines()[-1] == line
    assert f"their logs: {tmp_path / 'runs' / 'test' / 'logs' / 'rank-'}" in p.stderr


def test_only_a_user_error_with_ranks_stopped_for_it_is_reported_as_one():
    sigterm, sigkill = -signal.SIGTERM, -signal.SIGKILL
    assert user_error_only([2, 2]) and user_error_only([2, sigterm])  # torchrun stopped the other rank
    assert not user_error_only([2, 1]) and not user_error_only([sigkill, 2]) and not user_error_only([sigterm])


def test_sigterm_to_the_launcher_stops_all_ranks_at_one_step_with_a_verified_checkpoint(runs):
    base, cfg, store = runs.new("sigterm")
    run_dir = base / "runs" / "test"
    proc = subprocess.Popen([sys.executable, "-m", "baton.cli", "train", "--config", str(cfg), "--no-progress",
                             "--nproc", "2", "--set", "train.steps=100000"], cwd=ROOT, env=rank_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        metrics = run_dir / "metrics.jsonl"
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    stops = [re.search(r"stopping at step (\d+)", (run_dir / "logs" / f"rank-{r}.log").read_text())
             for r in (0, 1)]
    assert all(stops), err
    step = int(stops[0].group(1))
    assert int(stops[1].group(1)) == step  # the same boundary on both ranks
    import json

    pointer = json.loads((store / "test" / "latest.json").read_text())
    assert pointer["step"] == step and 3 <= step < 100000
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["stopped_by"] == "SIGTERM"
    assert [c["step"] for c in summary["checkpoints"] if c["verified"]][-1] == step
    for r in (0, 1):
        assert re.search(rf"EXIT rank={r} status=0$", (run_dir / "logs" / f"rank-{r}.log").read_text(), re.M)
    assert "all 2 local ranks checkpointed and exited cleanly" in err


def test_torchrun_command_single_and_multi_node():
    single = torchrun_command(LaunchSpec(nproc=4), ["--config", "c.toml"], "myrun")
    assert single[1:3] == ["-m", "baton.runtime.agent"]  # torchrun's main, its failure report left to baton
    assert "--standalone" in single and single[single.index("--nproc-per-node") + 1] == "4"
    assert single[-5:] == ["-m", "baton.cli", "train", "--config", "c.toml"]  # the module, never a script path
    rdzv = torchrun_command(LaunchSpec(nproc=8, nnodes="2", rdzv_endpoint="10.0.0.1:29400"), [], "myrun")
    joined = " ".join(rdzv)
    assert "--standalone" not in rdzv
    assert "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 --rdzv-id myrun" in joined
    static = torchrun_command(LaunchSpec(nproc=2, nnodes="2", node_rank=1, master_addr="node0", master_port=29500),
                              [], "myrun")
    assert "--nnodes 2 --node-rank 1 --master-addr node0 --master-port 29500" in " ".join(static)


def test_launcher_flags_are_checked_and_train_flags_are_passed_on(make_config, baton_cli):
    cfg = make_config()
    p = baton_cli("train", "--config", str(cfg), "--nproc", "2", "--nnodes", "2")
    assert p.returncode == 2 and "needs --rdzv-endpoint" in p.stderr
    p = baton_cli("train", "--config", str(cfg), "--master-addr", "node0")
    assert p.returncode == 2 and "--master-addr needs --node-rank" in p.stderr
    # 8 samples per step cannot be split over 3 ranks: refused before any process starts.
    p = baton_cli("train", "--config", str(cfg), "--nproc", "3")
    assert p.returncode == 2 and "not divisible by micro_batch 4 x 3 ranks" in p.stderr
    assert "launching" not in p.stderr

    from baton.api import rank_args
    from baton.config import load_config

    loaded = load_config(cfg, ["optim.lr=1e-3", "train.steps=12"])
    argv = rank_args(loaded, "auto", 5, 1.0e9, None, ("model.rope_theta",), False)
    # The ranks read the resolved config (overrides applied) from the launcher's file, and the train flags.
    assert argv[:2] == ["--config", str(loaded.run_dir / "launch" / "config.json")]
    assert load_config(argv[1]).to_dict() == loaded.to_dict()
    assert "--nproc" not in argv and "--nnodes" not in argv and "--set" not in argv
    assert "--stop-after-steps 5" in " ".join(argv) and "--allow-change model.rope_theta" in " ".join(argv)
    assert "--no-progress" in argv


def test_failure_report_finds_tracebacks_anywhere_in_a_rank_log(tmp_path):
    text = "\n".join([
        "2026-01-01 00:00:00,000 [rank 3] INFO baton: started",
        "2026-01-01 00:00:01,000 [rank 3] ERROR baton: rank 3 failed: ValueError: early",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "ValueError: early",
        *[f"2026-01-01 00:00:02,{i:03d} [rank 3] INFO baton: later line {i}" for i in range(200)],
        "2026-01-01 00:00:03,000 [rank 3] INFO baton: EXIT rank=3 status=1",
    ])
    rl = parse_rank_log(3, tmp_path / "rank-3.log", text)
    assert rl.exit_status == 1
    assert len(rl.tracebacks) == 1 and "ValueError: early" in rl.tracebacks[0]
    assert 'File "x.py", line 1' in rl.tracebacks[0] and "later line" not in rl.tracebacks[0]
    assert rl.first_error_at == "2026-01-01 00:00:01,000"
