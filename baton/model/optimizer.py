"""The optimizer a run uses and the precision it must run in.

``optim.name = "adamw"``: AdamW for every parameter (no decay on norms and biases). ``"muon"``: torch's Muon
(its Newton-Schulz iterations batched over same-shaped matrices: baton.model.muon) for the 2-D weight matrices
inside the transformer blocks (attention q/k/v/o, MLP gate/up/down), AdamW for everything else (embeddings, the
output head, norms). The two step as one optimizer (``Combined``), so the
GradScaler, gradient clipping, the schedule and the checkpoint see a single object.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch

from ..config import Config, OptimConfig

# A block's matrices: Llama names them model.layers.<i>.self_attn.*_proj / mlp.*_proj; a DDP or compile
# wrapper may put a prefix before them.
_BLOCK_MATRIX = re.compile(r"(^|\.)model\.layers\.\d+\.")


def build_optimizer(model: torch.nn.Module, cfg: Config, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer ``cfg.optim.name`` names, over ``model``'s parameters (every caller builds it here)."""
    if cfg.optim.name == "muon":
        return muon(model, cfg, device)
    return adamw(model, cfg, device)


def adamw(model: torch.nn.Module, cfg: Config, device: torch.device,
          params: Iterable[torch.nn.Parameter] | None = None) -> torch.optim.AdamW:
    chosen = list(model.parameters()) if params is None else list(params)
    decay = [p for p in chosen if p.dim() >= 2]
    no_decay = [p for p in chosen if p.dim() < 2]
    o = cfg.optim
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
        # Fused: one kernel per parameter group instead of a dozen foreach passes, 2-3x faster on CPU too.
        # Sharded (DTensor) parameters on CPU keep the foreach path, the one FSDP on gloo is tested with.
        fused=device.type == "cuda" or (device.type == "cpu" and all(type(q) is torch.nn.Parameter
                                                                      for q in model.parameters())),
    )


def muon_split(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    """(names for Muon, names for AdamW): Muon takes the 2-D matrices inside the transformer blocks only. The
    embedding and the output head are 2-D too, but a row lookup and a classifier are not hidden layers."""
    to_muon: list[str] = []
    to_adamw: list[str] = []
    for name, p in model.named_parameters():
        (to_muon if p.dim() == 2 and _BLOCK_MATRIX.search(name) else to_adamw).append(name)
    return to_muon, to_adamw


def muon(model: torch.nn.Module, cfg: Config, device: torch.device) -> Combined:
    o = cfg.optim
    names, _ = muon_split(model)
    chosen = set(names)
    params = dict(model.named_parameters())
    matrices = [params[n] for n in names]
    rest = [p for n, p in params.items() if n not in chosen]
    from .muon import Muon  # torch 2.9 and newer (runtime.features says so before a session gets here)

    hidden = Muon(matrices, lr=o.muon_lr, weight_decay=o.muon_weight_decay, momentum=o.muon_momentum,
                              nesterov=o.muon_nesterov, ns_steps=o.muon_ns_steps, adjust_lr_fn=o.muon_adjust_lr)
    return Combined(adamw(model, cfg, device, rest), hidden)


def split_summary(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Which optimizer holds how many tensors and values: printed at start, kept in the run summary."""
    parts = optimizer.parts if isinstance(optimizer, Combined) else (optimizer,)
    out: dict[str, Any] = {}
    for part in parts:
        ps = [p for g in part.param_groups for p in g["params"]]
        out[type(part).__name__.lower()] = {"tensors": len(ps), "params": sum(p.numel() for p in ps)}
    return out


def is_muon_group(group: dict[str, Any]) -> bool:
    return "ns_steps" in group  # a hyper-parameter only Muon's groups carry


def set_lr(optimizer: torch.optim.Optimizer, o: OptimConfig, factor: float) -> dict[str, float]:
    """Every group at its own optimizer's peak times the schedule's factor. The peaks come from the config,
    not from the groups: a resume restores the saved groups, and a changed optim.lr must still take effect.
    Returns the learning rates set, for the metrics (``lr``, and ``lr_muon`` when Muon runs)."""
    lrs = {"lr": o.lr * factor}
    for group in optimizer.param_groups:
        if is_muon_group(group):
            lrs["lr_muon"] = group["lr"] = o.muon_lr * factor
        else:
            group["lr"] = lrs["lr"]
    return lrs


class Combined(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters, stepping as one.

    ``param_groups`` lists the parts' own group dicts (AdamW's first), so what is set on a group reaches the
    part, and the GradScaler unscales and inf-checks every gradient before one ``step`` that either runs all
    parts or, on an overflow, none. The state dict numbers parameters across the parts in that order: it is
    the one a single optimizer over the same groups would have, which the checkpoint names by parameter.
    """

    def __init__(self, *parts: torch.optim.Optimizer):
        # Optimizer.__init__ is not called: it would copy the groups, and the parts must stay the owners.
        self.parts = parts
        self.defaults: dict[str, Any] = {}

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        # Read anew each time: a part's load_state_dict replaces its group dicts with new ones.
        return [g for part in self.parts for g in part.param_groups]

    @property
    def state(self) -> dict[torch.Tensor, Any]:  # a read-only view: each part writes its own
        return {p: s for part in self.parts for p, s in part.state.items()}

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        if closure is not None:
            raise RuntimeError("Combined.step takes no closure")
        for part in self.parts:
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def _spans(self) -> list[tuple[int, int, int, int]]:
        """Per part: (first group, groups, first parameter index, parameters)."""
        out, g0, i0 = [], 0, 0
        for part in self.parts:
            n = sum(len(g["params"]) for g in part.param_groups)
            out.append((g0, len(part.param_groups), i0, n))
            g0, i0 = g0 + len(part.param_groups), i0 + n
        return out

    def state_dict(self) -> dict[str, Any]:
        state: dict[int, Any] = {}
        groups: list[dict[str, Any]] = []
        for part, (_, _, i0, _) in zip(self.parts, self._spans()):
            sd = part.state_dict()
            state.update({i0 + i: s for i, s in sd["state"].items()})
            groups += [{**g, "params": [i0 + i for i in g["params"]]} for g in sd["param_groups"]]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"the state has {len(groups)} parameter groups, this optimizer {len(self.param_groups)}")
        for part, (g0, ng, i0, n) in zip(self.parts, self._spans()):
            part.load_state_dict({
                "state": {i - i0: s for i, s in state_dict["state"].items() if i0 <= i < i0 + n},
                "param_groups": [{**g, "params": [i - i0 for i in g["params"]]} for g in groups[g0:g0 + ng]],
            })


def check_precision(model: torch.nn.Module, scaler: torch.amp.GradScaler, precision: str) -> None:
    """Asserted at runtime, not configured and hoped: fp32 masters, a scaler live exactly for fp16."""
    bad = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if bad:
        raise RuntimeError(f"master weights must be fp32; {bad[:3]} are not")
    if scaler.is_enabled() != (precision == "fp16"):
        raise RuntimeError("GradScaler must be enabled exactly when precision is fp16")
