"""Bit-exact resume on CPU: stopped, wiped, resumed, killed mid-step, resumed again == never interrupted."""

import shutil
import signal
import subprocess
import sys
import time

from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors

# 16 micro-batches per step makes a step long enough (~0.1 s) that a kill lands inside one.
GEOMETRY = ["--set", "train.global_batch=64", "--set", "train.micro_batch=4", "--no-progress"]


def test_interrupted_run_equals_uninterrupted_run(make_config, baton_cli, tmp_path):
    cfg = str(make_config())
    store, runs = tmp_path / "store", tmp_path / "runs"

    baton_cli("train", "-c", cfg, "--set", "run.name=a", *GEOMETRY, check=True)

    # A fresh interpreter for this leg and the killed one: their hash seeds and start-up differ from the
    # zygote's children, so state that depends on either could not match by coincidence.
    leg1 = baton_cli("train", "-c", cfg, "--set", "run.name=b", *GEOMETRY, "--stop-after-steps", "8", check=True,
                     fresh=True)
    assert "starting run 'b' at step 0" in leg1.stderr
    shutil.rmtree(runs / "b")  # a new machine: nothing local survives

    leg2 = baton_cli("train", "-c", cfg, "--set", "run.name=b", *GEOMETRY, "--stop-after-steps", "14", check=True)
    assert "auto-resume" in leg2.stderr and "step 8" in leg2.stderr
    shutil.rmtree(runs / "b")

    # Third process: resume at 14 and die by SIGKILL somewhere inside a later step.
    proc = subprocess.Popen([sys.executable, "-m", "baton.cli", "train", "-c", cfg, "--set", "run.name=b", *GEOMETRY],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    metrics = runs / "b" / "metrics.jsonl"
    while time.time() < deadline:
        if metrics.exists() and any(r["step"] >= 16 for r in read_metrics(runs / "b")):
            break
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    _, _, pointer = store_checkpoint_tensors(store, "b")
    assert pointer["step"] == 14, "a killed session must leave the pointer on the last verified checkpoint"

    leg4 = baton_cli("train", "-c", cfg, "--set", "run.name=b", *GEOMETRY, check=True)
    assert "step 14" in leg4.stderr

    model_a, optim_a, pa = store_checkpoint_tensors(store, "a")
    model_b, optim_b, pb = store_checkpoint_tensors(store, "b")
    assert pa["step"] == pb["step"] == 20 and pa["complete"] and pb["complete"]
    assert_tensors_equal(model_a, model_b)
    assert_tensors_equal(optim_a, optim_b)
    trace_a = [(r["step"], r["loss"], r["grad_norm"], r["samples_consumed"]) for r in read_metrics(runs / "a")]
    trace_b = [(r["step"], r["loss"], r["grad_norm"], r["samples_consumed"]) for r in read_metrics(runs / "b")]
    assert [s for s, *_ in trace_b] == list(range(1, 21))
    assert trace_a == trace_b  # exact float equality, not a tolerance
    assert pb["cursor"]["samples_consumed"] == 20 * 64
    assert pa["val_loss"] == pb["val_loss"]
