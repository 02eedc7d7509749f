"""``train.compile_scope = "blocks"``: the decoder block compiled once and run by every layer, instead of the
whole model unrolled into one graph.

The model is 22 copies of one block (configs/ref-106m.toml). Compiled whole, dynamo traces all 22 and inductor
generates and compiles the code of one long graph; compiled per block, it traces one, and every layer runs the
same compiled code (the layers' weights are the graph's inputs, not constants baked into it). On the CPU that
took the cold compile of a 22-layer model from 63 s to 27 s (tiny widths, one run each; benchmarks/RESULTS.md),
and a warm start has one graph to trace instead of 22 layers' worth.

How: each decoder layer's ``forward`` is replaced, on the instance, by one that calls a single
``CompiledOrEager`` of the block class's own ``forward`` (so a compile failure falls back to eager for every
layer at once, said in one line, as for the whole model). Only with gradients on: a held-out evaluation
(``torch.no_grad``) runs the layers eagerly, so its other batch shape never makes dynamo compile a second,
dynamic-shape variant that training could then run. Under activation checkpointing the block's forward is
transformers' checkpointing wrapper, so dynamo traces the checkpoint with the block, where it can follow it (a
forward with a side effect it cannot replay in the backward, such as the hub-kernel attention wrapper of the
``kernels`` package, makes it run the block eagerly, as the layers of a whole-model compile then run too). The
layers are found again at every call (a rollback builds a new model), and installing on a layer that has it
already does nothing.

Sharing one compiled function across layers needs dynamo to treat a module's parameters as inputs
(``inline_inbuilt_nn_modules``, the default from torch 2.5); on an older torch each layer would be compiled
anew, so the whole model is compiled instead, said once.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from typing import Any

import torch

from .compiled import CompiledOrEager

log = logging.getLogger(__name__)

MARK = "_baton_block_forward"
INLINE_MODULES_FROM = (2, 5)  # dynamo's inline_inbuilt_nn_modules on by default  # on the forward installed on a layer: the CompiledBlocks it belongs to


def supported(version: str | None = None) -> bool:
    """Whether dynamo reuses one compiled block for every layer (parameters as graph inputs: torch 2.5+)."""
    release = (version or torch.__version__).split("+")[0].split(".")
    try:
        return (int(release[0]), int(release[1])) >= INLINE_MODULES_FROM
    except (IndexError, ValueError):
        return False


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder blocks of a (possibly DDP-wrapped) LlamaForCausalLM."""
    inner = getattr(model, "module", model)
    return list(inner.model.layers)


class CompiledBlocks:
    """One compiled ``forward`` per block class, installed on every decoder layer of the models it is given.

    ``parts``: the list that collects each ``CompiledOrEager`` made here (the run summary's
    ``compile_fallbacks`` reads it)."""

    def __init__(self, backend: str | Callable | None = None, parts: list[Any] | None = None):
        self.backend = backend
        self.parts = parts if parts is not None else []
        self._compiled: dict[Callable, CompiledOrEager] = {}

    def install(self, model: torch.nn.Module) -> None:
        for layer in decoder_layers(model):
            mine = getattr(layer.__dict__.get("forward"), MARK, None)
            if mine is self:
                continue
            plain = type(layer).forward  # FSDP2's per-instance subclass inherits the block's own forward
            compiled = self._compiled.get(plain)
            if compiled is None:
                compiled = self._compiled[plain] = CompiledOrEager(plain, "the decoder block", self.backend)
                self.parts.append(compiled)
            layer.forward = types.MethodType(_dispatch(plain, compiled, self), layer)


def _dispatch(plain: Callable, compiled: CompiledOrEager, owner: CompiledBlocks) -> Callable:
    def forward(layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            return compiled(layer, *args, **kwargs)
        return plain(layer, *args, **kwargs)

    setattr(forward, MARK, owner)
    return forward
