"""torch's Muon with the Newton-Schulz iterations of same-shaped matrices done together.

``torch.optim.Muon`` orthogonalises each matrix on its own: five iterations of three matrix products each, for
every one of the reference model's 154 block matrices, 2,310 small products a step. On a GPU those are too small
to fill it, and the step pays for each launch. Here the updates of the matrices that have one shape (after the
wide orientation Newton-Schulz works in: a tall matrix is iterated as its transpose) are stacked, and each
iteration is three batched products over the whole stack: the reference model's matrices fall into three
stacks (576 x 576: q and o; 192 x 576: k and v; 576 x 1536: gate, up and down), 45 products a step.

Everything else is torch's Muon: the same hyper-parameters and state (``momentum_buffer``, so checkpoints move
between the two), the same momentum and Nesterov blend, the same bfloat16 iteration with its coefficients and
the same normalisation, learning-rate adjustment and decoupled weight decay. The one difference is rounding: a
batched product and a norm over a stack may sum in another order than their single-matrix forms, so the two
optimizers agree within bfloat16's rounding, not bit for bit (tests/model/test_muon_batched.py states the bound).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

# torch.optim.Muon is torch 2.9's. On an older torch runtime.features refuses optim.name = "muon" before a session
# builds an optimizer; the module itself still imports there, as every module of the package does.
_TorchMuon: Any = getattr(torch.optim, "Muon", torch.optim.Optimizer)


class Muon(_TorchMuon):
    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            bufs = []
            for p in params:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                bufs.append(state["momentum_buffer"])
            momentum = group["momentum"]
            for g, b in zip(grads, bufs):
                b.lerp_(g, 1 - momentum)
            updates = [g.lerp(b, momentum) for g, b in zip(grads, bufs)] if group["nesterov"] else bufs
            lr, decay = float(group["lr"]), group["weight_decay"]
            for p, o in zip(params, orthogonalised(updates, group["ns_coefficients"], group["ns_steps"], group["eps"])):
                p.mul_(1 - lr * decay)
                p.add_(o, alpha=-lr * lr_ratio(group["adjust_lr_fn"], p.shape[0], p.shape[1]))
        return loss


def orthogonalised(updates: list[torch.Tensor], coefficients: tuple[float, float, float], steps: int,
                   eps: float) -> list[torch.Tensor]:
    """Newton-Schulz's approximate orthogonalisation of each matrix in ``updates`` (bfloat16, in the same order
    and shapes), batched over the matrices of one shape."""
    if steps >= 100:
        raise ValueError("Muon's ns_steps must be below 100")
    a, b, c = coefficients
    stacks: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, u in enumerate(updates):
        rows, cols = sorted(u.shape)  # wide: iterate on the smaller Gram matrix
        stacks[(rows, cols, u.device, u.dtype)].append(i)
    out: list[torch.Tensor] = [torch.empty(0)] * len(updates)
    for members in stacks.values():
        x = torch.stack([_wide(updates[i]) for i in members]).bfloat16()
        x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)  # spectral norm at most 1
        for _ in range(steps):
            gram = x @ x.mT
            x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        for k, i in enumerate(members):
            out[i] = x[k].mT if updates[i].size(0) > updates[i].size(1) else x[k]
    return out


def _wide(m: torch.Tensor) -> torch.Tensor:
    return m.mT if m.size(0) > m.size(1) else m


def lr_ratio(adjust: str | None, rows: int, cols: int) -> float:
    """Muon's learning-rate scale for a ``rows x cols`` matrix under ``optim.muon_adjust_lr`` (torch's choices)."""
    if adjust is None or adjust == "original":
        return math.sqrt(max(1.0, rows / cols))
    if adjust == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    if adjust == "spectral_unclamped":
        return math.sqrt(rows / cols)
    return 1.0
