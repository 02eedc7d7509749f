"""The model: transformers' LlamaForCausalLM, built from our config, with a closed-form size."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ..config import ModelConfig
from ..errors import ConfigError


def hf_config(m: ModelConfig) -> LlamaConfig:
    cfg = LlamaConfig(
        vocab_size=m.vocab_size,
        hidden_size=m.hidden,
        intermediate_size=m.ffn,
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads,
        num_key_value_heads=m.n_kv_heads,
        max_position_embeddings=m.max_seq_len,
        tie_word_embeddings=m.tie_embeddings,
        # transformers 5 keeps theta here; the old flat `rope_theta` field is ignored.
        rope_parameters={"rope_type": "default", "rope_theta": float(m.rope_theta)},
        rms_norm_eps=m.norm_eps,
        initializer_range=m.init_std,
        attention_bias=False,
        mlp_bias=False,
        use_cache=False,
    )
    # "auto" is resolved on the device when a session starts (baton.runtime.attention.resolve); a model built
    # outside one (export, evaluation, a bench cell) takes sdpa, what auto is everywhere but on pre-Ampere GPUs.
    cfg._attn_implementation = "sdpa" if m.attn == "auto" else m.attn
    return cfg


def param_count(m: ModelConfig) -> int:
    """Closed-form parameter count; must equal the built model's (tested for both reference shapes)."""
    head_dim = m.hidden // m.n_heads
    kv = m.n_kv_heads * head_dim
    attn = 2 * m.hidden * m.hidden + 2 * m.hidden * kv  # q, o + k, v
    mlp = 3 * m.hidden * m.ffn  # gate, up, down
    norms = 2 * m.hidden
    embed = m.vocab_size * m.hidden
    head = 0 if m.tie_embeddings else m.vocab_size * m.hidden
    return embed + m.n_layers * (attn + mlp + norms) + m.hidden + head


def build_model(m: ModelConfig, device: str | torch.device = "cpu", seed: int | None = None) -> LlamaForCausalLM:
    """Build on ``device`` (``"meta"`` builds the shape without memory). Weights are fp32 masters."""
    if m.attn == "flash_attention_2":
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            raise ConfigError(
                "model.attn='flash_attention_2' needs the flash-attn package and a CUDA GPU "
                "(install flash-attn, or use model.attn='sdpa')"
            ) from None
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(hf_config(m))
    if m.tie_embeddings and model.lm_head.weight is not model.model.embed_tokens.weight:
        # transformers 5.0 leaves a model built on the meta device untied (later releases tie it there too):
        # tie it, or the shape counts a second vocabulary x hidden matrix the run never has.
        model.tie_weights()
    model.to(torch.float32)
    if m.grad_ckpt:
        # transformers 5 renamed the switch; accept both so a minor upgrade cannot silently drop it.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        on = getattr(model, "is_activation_checkpointing", None)
        if not (on if on is not None else model.is_gradient_checkpointing):
            raise RuntimeError("activation checkpointing was requested but transformers did not enable it")
    return model


def count_parameters(model: torch.nn.Module) -> int:
    # parameters() yields a tied weight once, which is what the closed form counts.
    return sum(p.numel() for p in model.parameters())
