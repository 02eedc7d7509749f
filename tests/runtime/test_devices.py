"""Which GPU a process takes: train.device in a single process, the local rank under torchrun, and more ranks
than GPUs refused in one line. What torch.cuda reports is faked (this machine may have no GPU); the code
under test is the real session build, rank set-up and launcher."""

from __future__ import annotations

import pytest
import torch

import baton
from baton.config import load_config
from baton.errors import BatonError, ConfigError
from baton.runtime import dist
from baton.session import parts


class Built(Exception):
    """Raised where the session build first uses its device: the build stops there."""


@pytest.fixture
def two_gpus(monkeypatch):
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.append(d))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[-1] if current else 0)
    return current


def build_device(monkeypatch, cfg) -> torch.device:
    def check(attn, device):
        raise Built(device)

    monkeypatch.setattr(parts.attention, "check", check)
    with pytest.raises(Built) as e:
        parts.build(cfg, None, 0.0, None, resume="never")
    return e.value.args[0]


@pytest.mark.parametrize("spec, want", [("cuda:1", 1), ("cuda:0", 0), ("cuda", 0), ("auto", 0)])
def test_a_single_process_trains_on_the_gpu_train_device_names(monkeypatch, make_config, two_gpus, spec, want):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    device = build_device(monkeypatch, load_config(make_config(), [f"train.device={spec}"]))
    assert device == torch.device("cuda", want) and two_gpus == [want]  # and it is the current device


def test_a_gpu_index_past_the_visible_ones_is_refused(monkeypatch, make_config, two_gpus):
    with pytest.raises(ConfigError) as e:
        build_device(monkeypatch, load_config(make_config(), ["train.device=cuda:2"]))
    assert str(e.value) == "train.device='cuda:2' but 2 CUDA GPUs are visible (cuda:0 to cuda:1; check CUDA_VISIBLE_DEVICES)"


def test_a_rank_past_the_visible_gpus_is_refused_in_one_line(monkeypatch, two_gpus):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ConfigError) as e:
        dist.init("cuda")
    assert str(e.value) == ("this node starts more ranks than it has GPUs: local rank 2, and 2 CUDA GPUs visible "
                            "(start at most 2 processes per node: --nproc 2)")
    assert two_gpus == []  # refused before any device was touched


def test_nproc_past_the_visible_gpus_is_refused_before_any_launch(monkeypatch, make_config, two_gpus):
    cfg = load_config(make_config(), ["train.device=cuda"])
    with pytest.raises(BatonError) as e:
        baton.train(cfg, nproc=3, progress=False)
    assert str(e.value) == ("--nproc 3 starts a process per GPU, and this machine has 2 CUDA GPUs visible: use "
                            "--nproc 2 or fewer (or check CUDA_VISIBLE_DEVICES)")
    assert not (cfg.run_dir / "logs").exists()  # no rank was started
    with pytest.raises(BatonError, match=r"^train.device='cuda:1' names one GPU, and --nproc 2 starts a process per GPU"):
        baton.train(load_config(make_config(), ["train.device=cuda:1"]), nproc=2, progress=False)


def test_settings_this_torch_lacks_are_refused_at_start_in_one_line(monkeypatch, make_config):
    """Muon (torch.optim.Muon, torch 2.9) and FSDP2 (torch 2.6) on an older torch: one line naming the version,
    before anything is written. (tests/compat runs the refusal on a real torch 2.4.)"""
    from baton.runtime import features

    monkeypatch.setattr(features, "_has_muon", lambda: False)
    monkeypatch.setattr(features, "_has_fsdp2", lambda: False)
    monkeypatch.setattr(torch, "__version__", "2.4.0+cu121")
    cfg = load_config(make_config(), ["optim.name=muon"])
    assert features.refusals(cfg, 1) == [
        'optim.name = "muon" needs torch.optim.Muon, which torch 2.9 and newer have, and this is torch 2.4.0 '
        '(upgrade torch, or use optim.name = "adamw")']
    fsdp = load_config(make_config(name="fsdp.toml"), ["train.parallel=fsdp"])
    assert features.refusals(fsdp, 1) == []  # one process trains the plain model
    assert features.refusals(fsdp, 2) == [(
        'train.parallel = "fsdp" needs FSDP2 (torch.distributed.fsdp.fully_shard), which torch 2.6 and newer have, '
        'and this is torch 2.4.0 (upgrade torch, or use train.parallel = "ddp")')]
    with pytest.raises(ConfigError, match=r'^optim.name = "muon" needs torch.optim.Muon'):
        parts.build(cfg, None, 0.0, None, resume="never")
    assert not cfg.run_dir.exists()
