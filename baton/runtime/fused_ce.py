"""``train.fused_ce``: the output head and the cross-entropy as one chunked kernel (liger-kernel's fused
linear cross-entropy), so the ``tokens x vocab`` logits never exist in memory at once.

At the reference shape (vocabulary 49,152) one micro-batch of 8 x 2048 tokens has 3 GiB of fp32 logits,
plus their gradient: the largest single allocation of a step, and the one that caps the micro-batch.
The kernels are Triton, so the fused path runs on CUDA only, and only with the optional extra
``pip install "baton[liger]"``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from contextlib import nullcontext

import torch

from ..errors import ConfigError


def installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def decide(setting: bool | str, device_type: str, liger: bool, parallel: str = "ddp") -> bool:
    """auto: on where it can run (CUDA, liger-kernel installed, not FSDP); true: on, or a one-line refusal."""
    possible = device_type == "cuda" and liger and parallel != "fsdp"
    if setting == "auto":
        return possible
    if setting and not possible:
        if parallel == "fsdp":
            why = "does not run under train.parallel='fsdp' (the head's weight is sharded outside the forward)"
        elif device_type != "cuda":
            why = f"needs a CUDA GPU (its kernels are Triton), and this session runs on {device_type}"
        else:
            why = 'needs the liger-kernel package (pip install "baton[liger]")'
        raise ConfigError(f"train.fused_ce=true {why} (or set train.fused_ce = \"auto\" or false)")
    return bool(setting)


# Logits are asked for at no position: the head's matmul then costs nothing, and the fused kernel does it.
_NO_POSITIONS = torch.empty(0, dtype=torch.long)


def head_inputs(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(final normed hidden states as ``tokens x hidden``, the output head's weight) for input ids ``x``.

    The model is called as a whole (through a DDP wrapper's forward, which the gradient reduction needs);
    the head's weight is read from the unwrapped model.
    """
    out = model(input_ids=x, logits_to_keep=_NO_POSITIONS.to(x.device), output_hidden_states=True)
    h = out.hidden_states[-1]  # after the final norm (transformers ties it to last_hidden_state)
    return h.reshape(-1, h.size(-1)), getattr(model, "module", model).lm_head.weight


def micro_loss_fn(autocast_dtype: torch.dtype | None) -> Callable:
    """``loss(model, x, y)`` like ``autotune.micro_loss_fn``, with the head fused into the cross-entropy."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    fused = LigerFusedLinearCrossEntropyLoss()

    def micro_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx = torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype is not None else nullcontext()
        with ctx:
            h, head = head_inputs(model, x)
            return fused(head, h, y.reshape(-1)).float()

    return micro_loss
