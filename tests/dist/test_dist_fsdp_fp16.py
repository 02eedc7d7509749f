"""FSDP with fp16: the GradScaler's overflow check sees every rank's gradient shards, so an overflow on one
rank skips the step on all of them. Two real gloo ranks (torchrun) run baton's FSDP layout for the proof
(benchmarks/fsdp_fp16_ranks.py, which gpu_check runs over NCCL); the config and the precision resolution
then allow the pair, and a whole session trains with it."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from baton.config import load_config
from baton.runtime import autotune
from support.distrun import ROOT, rank_env


def test_an_inf_on_one_shard_skips_the_step_on_every_rank(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "benchmarks" / "fsdp_fp16_ranks.py"), str(tmp_path), "cpu"]
    p = subprocess.run(cmd, cwd=ROOT, env=rank_env(), capture_output=True,
                       text=True, timeout=600, check=False)  # the timeout only catches a hang
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1))
    # Step 0: only rank 1's own shard overflowed, and both ranks skipped the update and halved the scale.
    assert r0[0]["own_grads_finite"] is True and r1[0]["own_grads_finite"] is False
    for r in (r0, r1):
        assert r[0]["weights_unchanged"] is True and (r[0]["scale_before"], r[0]["scale_after"]) == (1024.0, 512.0)
        # Step 1 is clean: the update happens and the scale stays.
        assert r[1]["weights_unchanged"] is False and (r[1]["scale_before"], r[1]["scale_after"]) == (512.0, 512.0)


def test_fsdp_with_fp16_is_accepted_and_auto_picks_fp16_below_ampere(monkeypatch):
    cfg = load_config(None, ["train.parallel=fsdp", "train.precision=fp16"])
    assert (cfg.train.parallel, cfg.train.precision) == ("fsdp", "fp16")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # a T4
    assert autotune.resolve_precision(torch.device("cuda", 0)) == "fp16"
    auto = load_config(None, ["train.parallel=fsdp", "train.precision=auto", "train.micro_batch=4",
                              "train.compile=false", "train.fused_ce=false"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    autotune.resolve(auto, torch.device("cuda", 0), 1)
    assert auto.train.precision == "fp16"


def test_fsdp_fp16_session_trains_checkpoints_the_scaler_and_resumes(runs):
    # The whole path on 2 gloo ranks: fp16 autocast and a GradScaler on CPU, sharded, saved whole, resumed.
    fp16 = ("--set", "train.parallel=fsdp", "--set", "train.precision=fp16", "--set", "train.micro_batch=2")
    first = runs.train("fsdp-fp16", "--nproc", "2", *fp16, "--stop-after-steps", "5")
    assert first.pointer["step"] == 5
    state = json.loads((first.store / "test" / first.pointer["path"] / "state.json").read_text())
    assert state["scaler"]["scale"] > 0 and state["config"]["train"]["precision"] == "fp16"
    second = runs.train("fsdp-fp16-resume", "--nproc", "2", *fp16, "--stop-after-steps", "8", store_from=first.store)
    assert "resumed at step 5" in second.log(0) and second.pointer["step"] == 8
    assert all(m["loss"] == m["loss"] for m in second.metrics)  # finite: no NaN
