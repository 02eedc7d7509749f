"""Non-finite numbers, made the way they happen: a learning rate so high that one update blows the weights
up, after which every forward pass overflows. Nothing in the loop is patched.

fp16 runs with autocast and a GradScaler on the CPU (torch supports both there), so the scaler itself
finds the overflow and skips the step; fp32 and bf16 skip the update on a non-finite loss or gradient norm.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from support.helpers import read_metrics


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_nonfinite_steps_are_skipped_counted_and_stop_the_run(precision, zygote, make_config, tmp_path):
    cfg = make_config()
    store, runs = tmp_path / "store", tmp_path / "runs"

    def train(*args: str):
        return zygote.run(["train", "-c", cfg, "--no-progress", "--set", f"train.precision={precision}", *args],
                          tmp_path / "out", timeout=120)

    assert train("--stop-after-steps", "4").returncode == 0
    # Step 5's update runs at lr 1e30: its own loss was finite, the weights it leaves are not usable.
    diverge = ["--set", "optim.lr=1e30", "--set", "train.ckpt_every=1"]
    r = train(*diverge, "--set", "train.max_nonfinite=5", "--stop-after-steps", "7")
    assert r.returncode == 0, r.stderr[-3000:]
    for step, n in ((6, 1), (7, 2)):
        assert f"step {step} skipped: non-finite loss or gradient" in r.stderr
        assert f"{n} in a row, {n} in this run" in r.stderr
    rows = {m["step"]: m for m in read_metrics(runs / "test")}
    assert [rows[s]["skipped"] for s in range(1, 8)] == [False] * 5 + [True] * 2
    assert json.loads((runs / "test" / "run_summary.json").read_text())["nonfinite_skips"] == 2

    # Checkpoints due at steps 6 and 7 (ckpt_every=1) waited for a finite step; the session's closing
    # checkpoint at 7 holds exactly step 5's weights and moments: the skipped updates changed nothing.
    p = json.loads((store / "test" / "latest.json").read_text())
    assert p["step"] == 7 and p["verified"][-2:] == ["ckpt/step-5", "ckpt/step-7"]
    s5, s7 = store / "test" / "ckpt" / "step-5", store / "test" / "ckpt" / "step-7"
    for name in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(str(s5 / name)), load_file(str(s7 / name))
        assert all(torch.equal(a[k], b[k]) for k in a), name
    st5, st7 = (json.loads((s / "state.json").read_text()) for s in (s5, s7))
    assert st7["stats"]["nonfinite_skips"] == 2 and st7["stats"]["consecutive_nonfinite"] == 2
    if precision == "fp16":
        # The scaler found the overflow: it halved its scale at each skipped step.
        assert st7["scaler"]["scale"] == st5["scaler"]["scale"] / 4
    else:
        assert st7["scaler"] is None

    # The streak goes on in the next session (the counter is in the checkpoint) and reaches the limit:
    # a clear stop, exit 2, no checkpoint; the pointer stays on step 7.
    r = train(*diverge, "--set", "train.max_nonfinite=3")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("baton: error:")]
    assert errors == ["baton: error: 3 consecutive steps (6-8) had non-finite loss or gradients, the limit "
                      "train.max_nonfinite=3; stopped without saving. The pointer still names step 7: lower "
                      "optim.lr (or use bf16 instead of fp16), or check the data, then resume"]
    assert json.loads((store / "test" / "latest.json").read_text())["step"] == 7
    assert not (runs / "test" / "ckpt" / "step-8").exists()
