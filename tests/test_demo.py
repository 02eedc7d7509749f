"""`make demo` (examples/demo.py on configs/demo.toml) end to end, and the embedded default configs/tiny.toml
over its full horizon: real configs, real corpus, each command in a fresh interpreter."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
# The full default run takes minutes on a quiet machine; the ceiling only catches a hang, never a slow machine.
HANG_S = 3600


@pytest.mark.slow
def test_tiny_default_trains_to_a_useful_loss_and_a_rerun_finds_it_complete(tmp_path, baton_cli):
    (tmp_path / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "tiny.toml", tmp_path / "configs" / "tiny.toml")

    # One torch thread: the suite's other worker shares the cores, and a thread per core beside it makes
    # every parallel region wait for a descheduled thread (minutes more on a busy machine).
    def demo(command: str):
        return baton_cli(command, "-c", "configs/tiny.toml", "--no-progress", cwd=tmp_path, check=True,
                         timeout=HANG_S, fresh=True, env={"OMP_NUM_THREADS": "1"})

    demo("prepare")
    first = demo("train")
    assert "starting run 'tiny' at step 0" in first.stderr

    summary = json.loads((tmp_path / "runs" / "tiny" / "run_summary.json").read_text())
    vocab = json.loads((tmp_path / "data" / "tiny" / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    assert summary["steps_done"] == summary["total_steps"] == 100
    assert summary["val_loss"] <= math.log(vocab) - 2.0, summary["val_loss"]
    pointer = json.loads((tmp_path / "store" / "tiny" / "latest.json").read_text())
    assert pointer["complete"] and pointer["step"] == 100 and pointer["final"]["path"] == "final"

    again = demo("train")
    assert "is complete" in again.stderr and "Nothing to do" in again.stderr
    assert "train tiny" not in again.stderr  # no training progress at all
    assert json.loads((tmp_path / "runs" / "tiny" / "run_summary.json").read_text()) == summary


# The demo's story on a model small enough for the suite: the shape and the horizon shrink, the relay does not.
SMALL = ("model.n_layers=2", "model.hidden=64", "model.n_heads=2", "model.ffn=128", "train.steps=20",
         "optim.warmup_steps=2")


@pytest.mark.slow
def test_demo_interrupts_session_one_and_an_empty_machine_resumes_it_without_losing_a_step(tmp_path):
    from transformers import AutoModelForCausalLM

    (tmp_path / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "demo.toml", tmp_path / "configs" / "demo.toml")
    # The demo stops session 1 once step 10 of 20 is done; a pause when step 15 begins keeps that window open
    # on a machine too busy to poll in time (the stop itself is the real SIGTERM).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BATON_FAULT_PAUSE": "step@15=3",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"),
                          *(a for kv in SMALL for a in ("--set", kv))],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    for n in range(1, 7):
        assert f" {n}/6  " in out.stdout

    store = tmp_path / "demo" / "remote" / "store" / "demo"
    ledger = sorted((json.loads(p.read_text()) for p in (store / "ledger").glob("*.json")),
                    key=lambda r: r["started_ts"])
    assert len(ledger) == 2
    first, second = ledger
    assert first["outcome"] == "stopped: SIGTERM" and second["outcome"] == "completed"
    stopped = max(c["step"] for c in first["checkpoints"] if c["verified"])
    assert 10 <= stopped < 20
    assert (first["steps_from"], first["steps_to"]) == (0, stopped)
    assert (second["steps_from"], second["steps_to"]) == (stopped, 20)
    # Session 1's checkpoint is the one session 2 resumed from, on a machine without the run's folder.
    assert json.loads((store / "ckpt" / f"step-{stopped}" / "state.json").read_text())["step"] == stopped
    assert re.search(rf"auto-resume: .* says step {stopped} at demo/ckpt/step-{stopped}\n", out.stdout)
    assert f"resumed at step {stopped} (samples consumed {stopped * 16})" in out.stdout
    assert "pulling 2 of 2 files" in out.stdout  # the empty machine got its data from the published copy

    pointer = json.loads((store / "latest.json").read_text())
    assert pointer["complete"] and pointer["step"] == 20 and pointer["cursor"]["samples_consumed"] == 20 * 16
    rows = (store / "ckpt" / "step-20" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == list(range(1, 21))  # none lost, none repeated

    model = AutoModelForCausalLM.from_pretrained(str(store / "final"), use_safetensors=True).eval()
    summary = json.loads((tmp_path / "demo" / "machine" / "runs" / "demo" / "run_summary.json").read_text())
    assert sum(p.numel() for p in model.parameters()) == summary["params"]
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert logits.shape == (1, 4, 4096) and bool(torch.isfinite(logits).all())
    assert "bits per byte" in out.stdout and "demo done in" in out.stdout
