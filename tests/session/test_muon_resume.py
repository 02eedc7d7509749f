"""Muon resumes bit-exactly on CPU: a run killed twice (SIGKILL, after a verified checkpoint each time) and
resumed from the store ends equal to one never interrupted, in weights, both optimizers' state and every
metric; and the run summary records the parameter split."""

import json
import shutil
import signal
import time

from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors

MUON = ["--set", "optim.name=muon", "--set", "optim.muon_lr=0.02", "--set", "train.ckpt_every=4"]
# 16 micro-batches per step: a step long enough that a kill lands inside one, as in test_resume_exact.py.
GEOMETRY = ["--set", "train.global_batch=64", "--set", "train.micro_batch=4", "--no-progress"]


def _kill_once_pointer_reaches(baton_cli, cfg: str, store, runs, step: int) -> int:
    """Start the run, SIGKILL it once the store's pointer names ``step`` or later; returns the pointer's step."""
    proc = baton_cli.start("train", "-c", cfg, "--set", "run.name=b", *MUON, *GEOMETRY)
    latest = store / "b" / "latest.json"
    deadline = time.time() + 300
    while time.time() < deadline:
        if latest.exists():
            try:
                if json.loads(latest.read_text())["step"] >= step:
                    break
            except ValueError:  # caught mid-write
                pass
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.01)
    proc.kill(signal.SIGKILL)
    assert proc.wait(timeout=30).returncode == -signal.SIGKILL
    shutil.rmtree(runs / "b")  # a new machine: nothing local survives
    return store_checkpoint_tensors(store, "b")[2]["step"]


def test_muon_killed_twice_equals_uninterrupted(make_config, baton_cli, tmp_path):
    cfg = str(make_config())
    store, runs = tmp_path / "store", tmp_path / "runs"

    a = baton_cli("train", "-c", cfg, "--set", "run.name=a", *MUON, *GEOMETRY, check=True)
    assert "optimizer muon: adamw 6 tensors" in a.stderr and "muon 14 tensors" in a.stderr

    first = _kill_once_pointer_reaches(baton_cli, cfg, store, runs, 4)
    second = _kill_once_pointer_reaches(baton_cli, cfg, store, runs, first + 4)
    assert 4 <= first < second < 20

    last = baton_cli("train", "-c", cfg, "--set", "run.name=b", *MUON, *GEOMETRY, check=True)
    assert f"resumed at step {second}" in last.stderr

    model_a, optim_a, pa = store_checkpoint_tensors(store, "a")
    model_b, optim_b, pb = store_checkpoint_tensors(store, "b")
    assert pa["step"] == pb["step"] == 20 and pa["complete"] and pb["complete"]
    assert_tensors_equal(model_a, model_b)
    assert_tensors_equal(optim_a, optim_b)
    assert "model.layers.0.mlp.up_proj.weight::momentum_buffer" in optim_b
    assert "model.embed_tokens.weight::exp_avg_sq" in optim_b
    keys = ("step", "loss", "grad_norm", "lr", "lr_muon", "batch_sha", "samples_consumed")
    trace_a = [tuple(r[k] for k in keys) for r in read_metrics(runs / "a")]
    trace_b = [tuple(r[k] for k in keys) for r in read_metrics(runs / "b")]
    assert [t[0] for t in trace_b] == list(range(1, 21))
    assert trace_a == trace_b  # exact float equality, not a tolerance
    assert pa["val_loss"] == pb["val_loss"]
    summary = json.loads((runs / "b" / "run_summary.json").read_text())
    assert summary["optimizer"]["name"] == "muon"
    assert summary["optimizer"]["muon"]["tensors"] == 14 and summary["optimizer"]["adamw"]["tensors"] == 6
    assert summary["optimizer"]["muon"]["params"] + summary["optimizer"]["adamw"]["params"] == summary["params"]
