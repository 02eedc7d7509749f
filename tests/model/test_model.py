import pytest
import torch

from baton.config import ModelConfig, load_config
from baton.model.llama import build_model, count_parameters, param_count

REF = dict(hidden=576, n_heads=9, n_kv_heads=3, ffn=1536, vocab_size=49152, tie_embeddings=True, rope_theta=10000.0)


@pytest.mark.parametrize("layers, expected", [(22, 106_194_240), (20, 99_114_048)])
def test_reference_shapes_on_meta_device(layers, expected):
    m = ModelConfig(n_layers=layers, **REF)
    model = build_model(m, "meta")
    assert count_parameters(model) == expected
    assert param_count(m) == expected
    assert model.config.rope_parameters["rope_theta"] == 10000.0
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_reference_config_file_builds_on_meta():
    cfg = load_config("configs/ref-106m.toml")
    assert cfg.tokens_per_step == 262_144
    assert cfg.total_steps == 3_814
    assert cfg.total_steps * cfg.tokens_per_step == 999_817_216
    assert cfg.train.global_batch // (cfg.train.micro_batch * 2) == 32  # accumulation on 2 ranks
    assert cfg.train.precision == "fp16" and cfg.model.attn == "auto" and cfg.model.grad_ckpt
    assert cfg.budget.bill_factor == 1.0  # its platform billed the container's wall-clock once, two GPUs or not
    model = build_model(cfg.model, "meta")
    assert count_parameters(model) == param_count(cfg.model) == 106_194_240


@pytest.mark.parametrize("tie", [True, False])
def test_closed_form_matches_built_model(tie):
    m = ModelConfig(n_layers=3, hidden=96, n_heads=6, n_kv_heads=2, ffn=200, vocab_size=777, tie_embeddings=tie)
    assert count_parameters(build_model(m, "meta")) == param_count(m)


def test_forward_backward_finite_with_gradients():
    m = ModelConfig(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, ffn=64, vocab_size=100, max_seq_len=16)
    model = build_model(m, "cpu", seed=0)
    x = torch.randint(0, 100, (2, 16))
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())
