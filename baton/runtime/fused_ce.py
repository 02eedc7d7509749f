"""``train.fused_ce``: the output head and the cross-entropy as one chunked computation, so the ``tokens x vocab``
logits never exist in memory at once.

At the reference shape (vocabulary 49,152) one micro-batch of 8 x 2048 tokens has 3 GiB of fp32 logits,
plus their gradient: the largest single allocation of a step, and the one that caps the micro-batch.

Two implementations:

- ``chunked`` (baton.runtime.chunked_ce): plain torch, a chunk of rows at a time. It runs on every device and
  under every precision (under fp16 it forms the logits' gradient with the GradScaler's scale applied), and
  with ``train.compile`` it is compiled together with the model: one graph from the input ids to the loss.
  ``auto`` picks it on CUDA; ``true`` is the same as ``"chunked"``.
- ``liger``: liger-kernel's fused linear cross-entropy (Triton, CUDA only, ``pip install "baton[liger]"``), kept
  outside the compiled graph (only the model's body is compiled): its kernel inside a graph fails fake-tensor
  propagation on some torch versions, and liger-kernel 0.8.1's fast path for fp32 weights with bf16
  gradients breaks under torch.compile before torch 2.13. Never under fp16: the kernel computes the logits'
  gradient already in the forward pass, in the 16-bit buffer of the logits, as ``(softmax - onehot) /
  tokens``, and multiplies by the GradScaler's scale only in the backward pass. The scale then protects
  nothing: at 4 x 1024 tokens an entry of a probability below about 1.2e-4 rounds to zero and one below
  2.4e-4 keeps at most fp16's smallest step, 2**-24 (at the start of training that is nearly the whole
  vocabulary of 49,152). bf16 has fp32's range, so there it is safe.

Neither runs under ``train.parallel = "fsdp"``: the head's weight is read outside the model's forward, where
FSDP holds only its shard. On CPU ``auto`` leaves the loss unfused, as CPU runs have always trained: the
logits of the models trained there are a few MB. ``chunked`` may be set there and is no slower (a forward and
backward of configs/tiny.toml's model took 6 % less time with it on a 2-core CPU: benchmarks/RESULTS.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext
from typing import Literal

import torch

from .. import extras
from ..config import FUSED_CE_FP16
from ..errors import ConfigError
from . import chunked_ce
from .compiled import CompiledOrEager

log = logging.getLogger(__name__)

Fused = Literal["chunked", "liger", False]  # what a setting resolves to


def installed() -> bool:
    """Whether liger's fused loss can be imported: a package that is present but broken (a Triton or torch it
    was not built for) counts as absent, so a session refuses ``liger`` at start instead of failing at the first
    step."""
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss  # noqa: F401
    except Exception as e:  # ImportError, or whatever a broken extension raises while it loads
        if not isinstance(e, ModuleNotFoundError) or e.name != "liger_kernel":
            log.warning("liger-kernel is installed but does not import (%s: %s); train.fused_ce = \"liger\" cannot "
                        "run", type(e).__name__, e)
        return False
    return True


def decide(setting: bool | str, device_type: str, liger: bool = False, parallel: str = "ddp") -> tuple[Fused, str]:
    """(what ``setting`` runs as, why) or a one-line refusal. auto: chunked on CUDA, off on CPU and under FSDP;
    true or "chunked": chunked; "liger": liger where it can run (CUDA, ``liger`` installed, not FSDP; fp16 is
    refused by the config's own check, and by ``refuse_liger_fp16`` when precision auto chose it)."""
    if setting is False:
        return False, "off"
    if parallel == "fsdp":
        if setting == "auto":
            return False, "train.parallel fsdp"
        raise ConfigError(f"train.fused_ce={_said(setting)} does not run under train.parallel='fsdp' (the head's "
                          "weight is sharded outside the forward; set train.fused_ce = \"auto\" or false)")
    if setting == "auto":
        return ("chunked", device_type) if device_type == "cuda" else (False, device_type)
    if setting in (True, "chunked"):
        return "chunked", "set"
    if device_type != "cuda":
        raise ConfigError(f"train.fused_ce='liger' needs a CUDA GPU (its kernels are Triton), and this session runs "
                          f"on {device_type} (set train.fused_ce = \"chunked\", \"auto\" or false)")
    if not liger:
        raise ConfigError(f"train.fused_ce='liger' needs the liger-kernel package ({extras.fix('liger_kernel')}, or "
                          "set train.fused_ce = \"chunked\")")
    return "liger", "set"


def refuse_liger_fp16(fused: Fused, precision: str) -> None:
    if fused == "liger" and precision == "fp16":
        raise ConfigError(FUSED_CE_FP16)


def _said(setting: bool | str) -> str:
    return str(setting).lower() if isinstance(setting, bool) else repr(setting)


# Logits are asked for at no position: the head's matmul then costs nothing, and the fused loss does it.
_NO_POSITIONS = torch.empty(0, dtype=torch.long)


def head_inputs(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(final normed hidden states as ``tokens x hidden``, the output head's weight) for input ids ``x``.

    The model is called as a whole (through a DDP wrapper's forward, which the gradient reduction needs);
    the head's weight is read from the unwrapped model.
    """
    out = model(input_ids=x, logits_to_keep=_NO_POSITIONS.to(x.device), output_hidden_states=True)
    h = out.hidden_states[-1]  # after the final norm (transformers ties it to last_hidden_state)
    return h.reshape(-1, h.size(-1)), getattr(model, "module", model).lm_head.weight


def micro_loss_fn(kind: Fused, autocast_dtype: torch.dtype | None, compiled: bool,
                  backend: str | Callable | None = None,
                  body: Callable[[torch.nn.Module, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
                  ) -> Callable:
    """``loss(model, x, y)`` like ``autotune.micro_loss_fn``, with the head fused into the cross-entropy.

    ``body``: what gives (hidden states, head weight) for input ids, when the caller compiles the model itself
    (``train.compile_scope = "blocks"``: the decoder block compiled once); None: ``head_inputs``, compiled here
    when ``compiled``. chunked, no ``body``: compiled as a whole (model and loss in one graph); with a ``body``:
    the chunked loss is compiled on its own beside it. liger: only the model's body is compiled; the fused
    kernel is never inside a graph. The compiled pieces made here are the function's ``compiled_parts``."""
    def ctx(device_type: str):
        return torch.autocast(device_type, dtype=autocast_dtype) if autocast_dtype is not None else nullcontext()

    if kind == "chunked":
        if body is None:
            def chunked_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                with ctx(x.device.type):
                    h, head = head_inputs(model, x)
                return chunked_ce.linear_cross_entropy(h, head, y.reshape(-1), dtype=autocast_dtype)

            return CompiledOrEager(chunked_loss, "the forward and loss", backend) if compiled else chunked_loss

        def head_loss(h: torch.Tensor, head: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return chunked_ce.linear_cross_entropy(h, head, y.reshape(-1), dtype=autocast_dtype)

        loss = CompiledOrEager(head_loss, "the loss", backend) if compiled else head_loss
        given = body

        def chunked_beside(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            with ctx(x.device.type):
                h, head = given(model, x)
            return loss(h, head, y)

        chunked_beside.compiled_parts = [loss] if compiled else []  # type: ignore[attr-defined]
        return chunked_beside

    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    fused = LigerFusedLinearCrossEntropyLoss()
    if body is None:
        body = CompiledOrEager(head_inputs, "the model body", backend) if compiled else head_inputs
        parts = [body] if compiled else []
    else:
        parts = []
    run_body = body

    def liger_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with ctx(x.device.type):
            h, head = run_body(model, x)
            return fused(head, h, y.reshape(-1)).float()

    liger_loss.compiled_parts = parts  # type: ignore[attr-defined]
    return liger_loss
