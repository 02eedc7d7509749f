"""How the model is spread over the ranks: DDP (a full replica per rank) or FSDP2 (``fully_shard``).

Checkpoints are always the full, unsharded state in baton's own format, whatever the layout: a run saved
by 2 FSDP ranks resumes in a single process, on DDP, or on a different number of FSDP ranks. To keep
one format, FSDP state is gathered to rank 0 (on CPU, one tensor at a time) into a plain copy of the
model and optimizer, which the ordinary checkpoint and export code then writes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from . import cuda

KINDS = ("ddp", "fsdp")


class Parallel:
    def __init__(self, kind: str, rank: int, world: int, device: torch.device):
        if kind not in KINDS:
            raise ValueError(f"unknown parallel kind {kind!r}")
        # One process has nothing to replicate or shard; it trains the plain model under either setting.
        self.kind = kind if world > 1 else "single"
        self.rank = rank
        self.device = device
        self._shadow: tuple[torch.nn.Module, torch.optim.Optimizer] | None = None

    @property
    def sharded(self) -> bool:
        return self.kind == "fsdp"

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer]):
        """Wrap the (already resumed) model; FSDP needs a new optimizer over the sharded parameters."""
        if self.kind == "single":
            return model, optimizer
        if self.kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            # No buffer broadcast before every forward: Llama's only buffers (RoPE frequencies) are constants.
            # (torch 2.13 renamed the switch; older releases only know the first name.)
            params = inspect.signature(DDP.__init__).parameters
            no_sync_buffers = ({"forward_sync_buffers": False} if "forward_sync_buffers" in params
                               else {"broadcast_buffers": False})
            return DDP(model, device_ids=ids, **no_sync_buffers), optimizer
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )
        from torch.distributed.fsdp import fully_shard

        full = StateDictOptions(full_state_dict=True)
        # The resumed moments are keyed by parameter name here, so they survive the parameter swap below.
        # They wait in host memory, and the plain optimizer's full copies leave the GPU before sharding: else
        # every rank holds the whole of both moments next to its new shards until the wrap returns. (The load
        # before this still put them on the GPU whole, once: a fully sharded load is still to do.)
        osd = None
        if optimizer.state:
            # (Not cpu_offload=True: with a full state dict that hands the state to rank 0 alone.)
            osd = _to_host(get_optimizer_state_dict(model, optimizer, options=full))
            optimizer.state.clear()
            if self.device.type == "cuda":
                cuda.empty_cache()
        for block in model.model.layers:  # one all-gather per block keeps at most one block unsharded
            fully_shard(block)
        fully_shard(model)
        sharded_opt = make_optimizer(model)
        if osd is not None:
            set_optimizer_state_dict(model, sharded_opt, osd, options=full)
        return model, sharded_opt

    def grad_sync(self, model: torch.nn.Module, enabled: bool):
        """Gradients cross ranks once per optimizer step: on the last micro-batch only."""
        if self.kind == "ddp" and not enabled:
            return model.no_sync()
        if self.kind == "fsdp":
            model.set_requires_gradient_sync(enabled)
        return nullcontext()

    def plain(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              build: Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer]]):
        """The full model and optimizer as plain modules, on rank 0 (None elsewhere).

        For FSDP this is a collective: every rank must call it at the same point.
        """
        if not self.sharded:
            return (getattr(model, "module", model), optimizer) if self.rank == 0 else None
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        gathered = StateDictOptions(full_state_dict=True, cpu_offload=True)
        msd = get_model_state_dict(model, options=gathered)
        osd = get_optimizer_state_dict(model, optimizer, options=gathered)
        if self.rank != 0:
            return None
        if self._shadow is None:
            self._shadow = build()
        shadow, shadow_opt = self._shadow
        shadow.load_state_dict(msd)
        set_optimizer_state_dict(shadow, shadow_opt, osd, options=StateDictOptions(full_state_dict=True))
        return shadow, shadow_opt


def _to_host(tree: Any) -> Any:
    """A copy of a state dict's nested dicts and lists with every tensor in host memory."""
    if isinstance(tree, torch.Tensor):
        return tree.cpu()
    if isinstance(tree, dict):
        return {k: _to_host(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_host(v) for v in tree)
    return tree


def replicated(t: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor (what clip_grad_norm_ returns under FSDP) as the plain tensor every rank holds
    (a collective, not a read to the host); any other tensor as it is."""
    full = getattr(t, "full_tensor", None)
    return full() if full is not None else t


def norm_value(t: Any) -> float:
    """A gradient norm as a float; under FSDP clip_grad_norm_ returns a (replicated) DTensor."""
    return float(replicated(t))
