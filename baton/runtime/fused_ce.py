"""``train.fused_ce``: the output head and the cross-entropy as one chunked kernel (liger-kernel's fused
linear cross-entropy), so the ``tokens x vocab`` logits never exist in memory at once.

At the reference shape (vocabulary 49,152) one micro-batch of 8 x 2048 tokens has 3 GiB of fp32 logits,
plus their gradient: the largest single allocation of a step, and the one that caps the micro-batch.
The kernels are Triton, so the fused path runs on CUDA only, and only with the optional extra
``pip install "baton[liger]"``.

Never under fp16: the fused kernel computes the logits' gradient already in the forward pass, in the
16-bit buffer of the logits, as ``(softmax - onehot) / tokens``, and multiplies by the GradScaler's scale
only in the backward pass. The scale then protects nothing: at 4 x 1024 tokens an entry of a probability
below about 1.2e-4 rounds to zero and one below 2.4e-4 keeps at most fp16's smallest step, 2**-24 (at the
start of training that is nearly the whole vocabulary of 49,152). bf16 has fp32's range, so there it is safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext

import torch

from .. import extras
from ..config import FUSED_CE_FP16
from ..errors import ConfigError

log = logging.getLogger(__name__)

def installed() -> bool:
    """Whether the fused loss can be imported: a package that is present but broken (a Triton or torch it
    was not built for) counts as absent, so ``auto`` leaves it off instead of failing at the first step."""
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss  # noqa: F401
    except Exception as e:  # ImportError, or whatever a broken extension raises while it loads
        if not isinstance(e, ModuleNotFoundError) or e.name != "liger_kernel":
            log.warning("liger-kernel is installed but does not import (%s: %s); train.fused_ce auto stays off",
                        type(e).__name__, e)
        return False
    return True


def decide(setting: bool | str, device_type: str, liger: bool, parallel: str = "ddp", precision: str = "fp32"
           ) -> bool:
    """auto: on where it can run and is safe (CUDA, liger-kernel installed, not FSDP, not fp16); true: on, or
    a one-line refusal."""
    possible = device_type == "cuda" and liger and parallel != "fsdp" and precision != "fp16"
    if setting == "auto":
        return possible
    if setting and not possible:
        if precision == "fp16":
            raise ConfigError(FUSED_CE_FP16)
        if parallel == "fsdp":
            why = "does not run under train.parallel='fsdp' (the head's weight is sharded outside the forward)"
        elif device_type != "cuda":
            why = f"needs a CUDA GPU (its kernels are Triton), and this session runs on {device_type}"
        else:
            why = f'needs the liger-kernel package ({extras.fix("liger_kernel")})'
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


def micro_loss_fn(autocast_dtype: torch.dtype | None, body: Callable = head_inputs) -> Callable:
    """``loss(model, x, y)`` like ``autotune.micro_loss_fn``, with the head fused into the cross-entropy.
    ``body``: ``head_inputs`` or a compiled form of it; the fused kernel itself is never inside a graph."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    fused = LigerFusedLinearCrossEntropyLoss()

    def micro_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx = torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype is not None else nullcontext()
        with ctx:
            h, head = body(model, x)
            return fused(head, h, y.reshape(-1)).float()

    micro_loss.compiled_parts = [body]  # type: ignore[attr-defined]
    return micro_loss
