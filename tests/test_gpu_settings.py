"""GPU settings decided on any machine: which attention kernel may run where, when the fused cross-entropy
is on, and what train.deterministic switches. The decisions are pure functions of what the device reports,
tested on the capability tuples real GPUs report; the session-level refusals run for real on CPU."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from baton.config import ModelConfig, load_config
from baton.errors import ConfigError
from baton.model.llama import build_model
from baton.runtime import determinism, fused_ce
from baton.runtime.attention import refusal
from baton.runtime.autotune import resolve
from baton.session.core import Session


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_eager_and_sdpa_run_everywhere(attn):
    assert refusal(attn, "cpu", None, False) is None
    assert refusal(attn, "cuda", (7, 5), False) is None


def test_flash_attention_2_needs_sm80_cuda_and_the_package():
    t4 = refusal("flash_attention_2", "cuda", (7, 5), True, "Tesla T4")
    assert t4 == ("model.attn='flash_attention_2' needs a GPU of compute capability 8.0 or newer (Ampere+), and "
                  "Tesla T4 is 7.5 (use model.attn='sdpa', or 'eager')")
    assert "V100" in refusal("flash_attention_2", "cuda", (7, 0), True, "Tesla V100") and "7.0" in \
        refusal("flash_attention_2", "cuda", (7, 0), True, "Tesla V100")
    for cap in [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0)]:  # A100, RTX 3090, L4, H100/H200, B200
        assert refusal("flash_attention_2", "cuda", cap, True) is None
    assert "pip install flash-attn" in refusal("flash_attention_2", "cuda", (9, 0), False)
    assert "needs a CUDA GPU" in refusal("flash_attention_2", "cpu", None, True)
    for cap, installed in [((7, 5), True), ((9, 0), False)]:
        assert "\n" not in refusal("flash_attention_2", "cuda", cap, installed)


def test_session_refuses_flash_attention_2_at_start(make_config):
    cfg = load_config(make_config(), ["model.attn=flash_attention_2"])
    with pytest.raises(ConfigError, match=r"^model.attn='flash_attention_2' needs a CUDA GPU, and this session "
                                          r"runs on cpu \(use model.attn='sdpa'\)$"):
        Session(cfg, resume="never", progress=False)
    assert not cfg.run_dir.exists()  # refused before anything was set up


def test_fused_ce_decision():
    d = fused_ce.decide
    assert d("auto", "cuda", True) is True
    assert d("auto", "cuda", False) is False and d("auto", "cpu", True) is False
    assert d("auto", "cuda", True, "fsdp") is False
    assert d(False, "cuda", True) is False and d(True, "cuda", True) is True
    with pytest.raises(ConfigError, match=r'needs the liger-kernel package \(pip install "baton\[liger\]"\)'):
        d(True, "cuda", False)
    with pytest.raises(ConfigError, match="needs a CUDA GPU .* runs on cpu"):
        d(True, "cpu", True)
    with pytest.raises(ConfigError, match="fsdp"):
        d(True, "cuda", True, "fsdp")
    with pytest.raises(ConfigError, match="train.fused_ce='yes' is not auto, true or false"):
        load_config(None, ["train.fused_ce=yes"])


def test_fused_ce_resolves_on_this_machine(make_config):
    cfg = load_config(make_config())
    notes = resolve(cfg, torch.device("cpu"), 1)
    assert cfg.train.fused_ce is False and notes["fused_ce"] == "auto -> False"
    with pytest.raises(ConfigError, match="train.fused_ce=true needs a CUDA GPU"):
        resolve(load_config(make_config(), ["train.fused_ce=true"]), torch.device("cpu"), 1)


def test_fused_head_inputs_give_the_models_logits():
    # The fused loss multiplies these two itself; through the head they must give the model's own logits.
    m = ModelConfig(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=512, max_seq_len=64)
    model = build_model(m, "cpu", seed=0)
    x = torch.randint(0, 512, (2, 16))
    h, w = fused_ce.head_inputs(model, x)
    assert h.shape == (32, 64) and w is model.lm_head.weight
    assert torch.equal(F.linear(h, w), model(input_ids=x).logits.reshape(32, 512))


def test_deterministic_switch(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("FLASH_ATTENTION_DETERMINISTIC", raising=False)
    assert load_config(None).train.deterministic is False
    assert load_config(None, ["train.deterministic=true"]).train.deterministic is True
    before = torch.backends.cudnn.benchmark
    try:
        determinism.enable()
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert os.environ["FLASH_ATTENTION_DETERMINISTIC"] == "1"
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:  # process-wide state: restored for the tests that follow
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, before
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the other deterministic setting is kept
    try:
        determinism.enable()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, before
