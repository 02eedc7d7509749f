"""FSDP with fp16: the GradScaler's overflow check sees every rank's gradient shards, so an overflow on one
rank skips the step on all of them. The two-rank proof itself (benchmarks/fsdp_fp16_ranks.py, over gloo here
and NCCL on a GPU) runs in gpu_check's smoke (tests/test_gpu_check.py); here the config and the precision
resolution allow the pair, and a whole session trains with it."""

from __future__ import annotations

import json

import torch

from baton.config import load_config
from baton.runtime import autotune


def test_fsdp_with_fp16_is_accepted_and_auto_picks_fp16_below_ampere(monkeypatch):
    cfg = load_config(None, ["train.parallel=fsdp", "train.precision=fp16"])
    assert (cfg.train.parallel, cfg.train.precision) == ("fsdp", "fp16")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # a T4
    assert autotune.resolve_precision(torch.device("cuda", 0)) == "fp16"
    # Attention set by hand: auto would time eager against SDPA on the (absent) T4 itself.
    auto = load_config(None, ["train.parallel=fsdp", "train.precision=auto", "train.micro_batch=4",
                              "train.compile=false", "train.fused_ce=false", "model.attn=sdpa"])
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
