"""optim.name: which parameters Muon takes, the combined optimizer's state round trip and refusals, the
GradScaler's unscale and skip over both optimizers, and the schedule on both peaks."""

from __future__ import annotations

import math

import pytest
import torch

from baton.checkpoint.state import load_optimizer, optimizer_tensors
from baton.config import Config, ModelConfig
from baton.errors import ResumeError
from baton.model.llama import build_model
from baton.model.optimizer import Combined, build_optimizer, muon_split, set_lr, split_summary

CPU = torch.device("cpu")
SHAPE = ModelConfig(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, ffn=64, vocab_size=97, max_seq_len=32)


def _cfg(name: str = "muon", **optim) -> Config:
    cfg = Config(model=SHAPE)
    cfg.optim.name = name
    for k, v in optim.items():
        setattr(cfg.optim, k, v)
    return cfg


def _setup(cfg: Config, seed: int = 0):
    model = build_model(cfg.model, CPU, seed=seed)
    return model, build_optimizer(model, cfg, CPU)


def _steps(model, opt, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        g = torch.Generator().manual_seed(100 + i)
        x = torch.randint(0, SHAPE.vocab_size, (2, 16), generator=g)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
    cfg = _cfg()
    model, opt = _setup(cfg)
    to_muon, to_adamw = muon_split(model)
    per_block = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj"]
    assert to_muon == [f"model.layers.{i}.{m}.weight" for i in range(2) for m in per_block]
    assert to_adamw == ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                        "model.layers.0.post_attention_layernorm.weight", "model.layers.1.input_layernorm.weight",
                        "model.layers.1.post_attention_layernorm.weight", "model.norm.weight"]
    assert isinstance(opt, Combined)
    adam, hidden = opt.parts
    assert isinstance(adam, torch.optim.AdamW) and isinstance(hidden, torch.optim.Muon)
    named = dict(model.named_parameters())
    assert [id(p) for g in hidden.param_groups for p in g["params"]] == [id(named[n]) for n in to_muon]
    split = split_summary(opt)
    assert split == {"adamw": {"tensors": 6, "params": 97 * 32 + 5 * 32},
                     "muon": {"tensors": 14, "params": sum(named[n].numel() for n in to_muon)}}
    assert sum(v["params"] for v in split.values()) == sum(p.numel() for p in model.parameters())
    g = hidden.param_groups[0]
    assert (g["lr"], g["momentum"], g["nesterov"], g["ns_steps"], g["adjust_lr_fn"], g["weight_decay"]) == \
           (0.02, 0.95, True, 5, "original", 0.0)


def test_adamw_is_unchanged_a_plain_torch_adamw():
    model, opt = _setup(_cfg("adamw"))
    assert type(opt) is torch.optim.AdamW and opt.defaults["fused"] is True
    assert split_summary(opt) == {"adamw": {"tensors": 20, "params": sum(p.numel() for p in model.parameters())}}


def test_schedule_sets_each_group_at_its_own_peak():
    cfg = _cfg(lr=1e-3, muon_lr=0.05)
    _, opt = _setup(cfg)
    assert set_lr(opt, cfg.optim, 0.5) == {"lr": 5e-4, "lr_muon": 0.025}
    assert [g["lr"] for g in opt.param_groups] == [5e-4, 5e-4, 0.025]
    _, plain = _setup(_cfg("adamw", lr=1e-3))
    assert set_lr(plain, cfg.optim, 0.25) == {"lr": 2.5e-4}


def test_state_round_trip_continues_exactly():
    """Saved by name after 3 steps, loaded into a fresh model and optimizer: 3 more steps on each are equal
    to the tensor, and so are the saved tensors and hyper-parameters."""
    cfg = _cfg(muon_momentum=0.9, muon_nesterov=False, muon_adjust_lr="match_rms_adamw")
    model, opt = _setup(cfg)
    _steps(model, opt, 3)
    tensors, groups = optimizer_tensors(model, opt)
    assert sorted({k.rpartition("::")[2] for k in tensors}) == ["exp_avg", "exp_avg_sq", "momentum_buffer", "step"]
    assert "model.layers.1.mlp.down_proj.weight::momentum_buffer" in tensors
    assert "model.layers.1.mlp.down_proj.weight::exp_avg" not in tensors
    assert groups[2]["ns_coefficients"] == [3.4445, -4.775, 2.0315]  # JSON-ready

    model2, opt2 = _setup(cfg, seed=1)
    model2.load_state_dict(model.state_dict())
    load_optimizer(model2, opt2, {k: v.clone() for k, v in tensors.items()}, groups)
    assert opt2.parts[1].param_groups[0]["ns_coefficients"] == (3.4445, -4.775, 2.0315)
    # The loaded parts hold new group dicts: the schedule must reach those, not the ones built first.
    for o in (opt, opt2):
        set_lr(o, cfg.optim, 0.5)
        assert [g["lr"] for part in o.parts for g in part.param_groups] == [1.5e-4, 1.5e-4, 0.01]
    _steps(model, opt, 3, first=3)
    _steps(model2, opt2, 3, first=3)
    for (n, a), (_, b) in zip(model.named_parameters(), model2.named_parameters()):
        assert torch.equal(a, b), n
    t1, g1 = optimizer_tensors(model, opt)
    t2, g2 = optimizer_tensors(model2, opt2)
    assert t1.keys() == t2.keys() and all(torch.equal(t1[k], t2[k]) for k in t1)
    assert g1 == g2


@pytest.mark.parametrize("name, changed", [
    ("adamw", {"weight_decay": 0.0, "beta2": 0.99, "eps": 1e-6}),
    ("muon", {"weight_decay": 0.0, "muon_momentum": 0.9, "muon_nesterov": False, "muon_weight_decay": 0.1}),
])
def test_a_resume_keeps_the_config_s_hyper_parameters_and_the_saved_moments(name, changed):
    """A resume that changes an optimizer setting (allowed: logged as a change) trains with the new value; the
    saved groups carry the old one, and torch's own load would quietly put that back."""
    model, opt = _setup(_cfg(name))
    _steps(model, opt, 2)
    tensors, groups = optimizer_tensors(model, opt)
    new = _cfg(name, **changed)
    model2, opt2 = _setup(new, seed=1)
    model2.load_state_dict(model.state_dict())
    built = [{k: v for k, v in g.items() if k != "params"} for g in opt2.param_groups]
    load_optimizer(model2, opt2, {k: v.clone() for k, v in tensors.items()}, groups)
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt2.param_groups] == built
    assert built != [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    t2, _ = optimizer_tensors(model2, opt2)
    assert t2.keys() == tensors.keys() and all(torch.equal(t2[k], tensors[k]) for k in tensors)


def test_partial_or_foreign_state_is_refused():
    cfg = _cfg()
    model, opt = _setup(cfg)
    _steps(model, opt, 1)
    tensors, groups = optimizer_tensors(model, opt)
    fresh = build_optimizer(model, cfg, CPU)
    key = "model.layers.0.self_attn.q_proj.weight::momentum_buffer"
    with pytest.raises(ResumeError, match=r"optimizer state is incomplete \(nothing for parameter "
                                          r"'model.layers.0.self_attn.q_proj.weight'\)"):
        load_optimizer(model, fresh, {k: v for k, v in tensors.items() if k != key}, groups)
    with pytest.raises(ResumeError, match=r"but the parameter is torch.float32 \(32, 32\)"):
        load_optimizer(model, fresh, {**tensors, key: tensors[key][:3]}, groups)
    # AdamW's state into the Muon run (the drift check refuses this first; the loader would too)
    adam_model, adam = _setup(_cfg("adamw"))
    _steps(adam_model, adam, 1)
    a_tensors, a_groups = optimizer_tensors(adam_model, adam)
    with pytest.raises(ResumeError, match=r"holds \['exp_avg', 'exp_avg_sq', 'step'\], its optimizer keeps "
                                          r"\['momentum_buffer'\]"):
        load_optimizer(model, fresh, a_tensors, a_groups)
    assert not fresh.state  # nothing half-loaded


def test_fp16_scaler_unscales_before_muon_and_skips_both_on_overflow():
    cfg = _cfg(muon_nesterov=False)
    model, opt = _setup(cfg)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x = torch.randint(0, SHAPE.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))

    def backward() -> dict[str, torch.Tensor]:
        loss = model(input_ids=x, labels=x).loss
        scaler.scale(loss).backward()
        return {n: p.grad.clone() / 1024.0 for n, p in model.named_parameters()}

    # An overflow in one Muon matrix: no parameter of either optimizer moves, no state starts, the scale halves.
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    backward()
    model.model.layers[0].mlp.up_proj.weight.grad[0, 0] = math.inf
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 512.0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert not opt.state
    opt.zero_grad(set_to_none=True)

    # A finite step: Muon's momentum starts from the unscaled gradient ((1 - momentum) x g from zero).
    scaler.update(1024.0)
    grads = backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    name = "model.layers.0.mlp.up_proj.weight"
    p = dict(model.named_parameters())[name]
    torch.testing.assert_close(opt.state[p]["momentum_buffer"], 0.05 * grads[name], rtol=1e-6, atol=0)
    assert not torch.equal(p, before[name])
    emb = model.model.embed_tokens.weight
    assert opt.state[emb]["step"].item() == 1.0 and not torch.equal(emb, before["model.embed_tokens.weight"])
