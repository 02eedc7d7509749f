"""The output head and the cross-entropy computed a row chunk at a time, in plain torch.

``linear_cross_entropy(h, weight, targets)`` is ``F.cross_entropy(F.linear(h, weight).float(), targets)``
(the mean over the targets that are not ``ignore_index``) without the ``tokens x vocab`` logits ever held at
once: the hidden states are cut into chunks of rows, and each chunk's logits live only while that chunk is
computed. Peak memory is that of one chunk (``rows x vocab``, a few hundred MB at most), not of the whole
micro-batch (at the reference shape, 8 x 2048 tokens x 49,152 are 3 GiB of fp32 logits and as much again
for their gradient).

The logits' gradient is ``(softmax - onehot) / n`` times the gradient of the loss. Two ways to get it:

- in the forward pass (``grad_in_forward``), while each chunk's logits are at hand: the backward pass then
  only scales the two gradients already made. The head's three matrix products (logits, the hidden states'
  gradient, the weight's gradient) run once each, as in the unfused loss. This is the way under bf16 and fp32.
- in the backward pass, recomputing each chunk's logits: one more matrix product per chunk, but the
  gradient is formed with the loss's own gradient already applied. Under fp16 that gradient carries the
  GradScaler's scale, and forming it unscaled first (as a kernel that computes it in the forward pass does)
  rounds most of the vocabulary's share to zero in fp16 (baton.runtime.fused_ce explains the numbers).

The matrix products run in ``dtype`` (the session's autocast dtype, or the inputs' own), the softmax, the
log-sum-exp and the loss in fp32, as the unfused loss does them. Everything is plain torch operations, so
``torch.compile`` traces the loss together with the model and fuses each chunk's element-wise work.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Logits per chunk, at most: 2**26 fp32 values are 256 MiB (the reference vocabulary gives chunks of 1,344
# rows, 13 chunks for a micro-batch of 8 x 2048 tokens). Larger chunks mean fewer, larger matrix products and
# fewer unrolled chunks for the compiler; smaller ones less memory.
CHUNK_LOGITS = 1 << 26
IGNORE_INDEX = -100  # F.cross_entropy's default: targets equal to it count neither in the loss nor in n


def chunk_rows(vocab: int, budget: int = CHUNK_LOGITS) -> int:
    """Rows per chunk for a vocabulary of ``vocab``: as many as ``budget`` logits allow, in multiples of 64 (the
    tiles of the matrix products) where there is room for one."""
    rows = max(1, budget // vocab)
    return rows - rows % 64 if rows >= 64 else rows


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         dtype: torch.dtype | None = None, rows: int | None = None,
                         grad_in_forward: bool | None = None, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The mean cross-entropy of ``h @ weight.T`` (``tokens x hidden`` by ``vocab x hidden``) against
    ``targets`` (``tokens``), as an fp32 scalar, a chunk of ``rows`` rows at a time (default: ``chunk_rows``).

    ``dtype``: what the matrix products run in (the autocast dtype; default ``h``'s). ``grad_in_forward``:
    see the module docstring; default on except under fp16."""
    dtype = h.dtype if dtype is None else dtype
    rows = chunk_rows(weight.size(0)) if rows is None else rows
    if grad_in_forward is None:
        grad_in_forward = dtype != torch.float16
    wants_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    return _LinearCrossEntropy.apply(h, weight, targets, dtype, rows, grad_in_forward and wants_grad, ignore_index)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, dtype, rows, grad_in_forward, ignore_index):
        with torch.autocast(h.device.type, enabled=False):  # the dtypes below are the ones that run
            hd, wd = h.to(dtype), weight.to(dtype)
            valid = targets != ignore_index
            n = valid.sum().clamp(min=1).to(torch.float32)  # no valid target: loss 0, as nothing to average
            loss = torch.zeros((), dtype=torch.float32, device=h.device)
            lse_parts = []
            grad_h = torch.empty_like(h) if grad_in_forward else None
            grad_w = torch.zeros_like(weight, dtype=torch.float32) if grad_in_forward else None
            for i in range(0, h.size(0), rows):
                logits = F.linear(hd[i:i + rows], wd).float()
                lse = torch.logsumexp(logits, dim=-1)
                v, y = valid[i:i + rows], targets[i:i + rows].clamp(min=0)  # ignored rows read class 0, weighted 0
                picked = logits.gather(1, y.unsqueeze(1)).squeeze(1)
                loss = loss + torch.where(v, lse - picked, 0.0).sum()
                if grad_in_forward:
                    g = _logits_grad(logits, lse, y, v, 1.0 / n).to(dtype)
                    grad_h[i:i + rows] = g @ wd
                    grad_w += (g.T @ hd[i:i + rows]).float()
                else:
                    lse_parts.append(lse)
            if grad_in_forward:
                ctx.save_for_backward(grad_h, grad_w)
            else:
                ctx.save_for_backward(h, weight, targets, torch.cat(lse_parts), n)
        ctx.grad_in_forward, ctx.dtype, ctx.rows, ctx.ignore_index = grad_in_forward, dtype, rows, ignore_index
        ctx.weight_dtype = weight.dtype
        return loss / n

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.grad_in_forward:
            grad_h, grad_w = ctx.saved_tensors
            return ((grad_h * grad_out).to(grad_h.dtype), (grad_w * grad_out).to(ctx.weight_dtype),
                    None, None, None, None, None)
        h, weight, targets, lse, n = ctx.saved_tensors
        dtype, rows = ctx.dtype, ctx.rows
        with torch.autocast(h.device.type, enabled=False):
            hd, wd = h.to(dtype), weight.to(dtype)
            valid = targets != ctx.ignore_index
            scale = grad_out.float() / n  # the loss's gradient (a GradScaler's scale included) before any rounding
            grad_h = torch.empty_like(h)
            grad_w = torch.zeros_like(weight, dtype=torch.float32)
            for i in range(0, h.size(0), rows):
                logits = F.linear(hd[i:i + rows], wd).float()
                g = _logits_grad(logits, lse[i:i + rows], targets[i:i + rows].clamp(min=0), valid[i:i + rows],
                                 scale).to(dtype)
                grad_h[i:i + rows] = g @ wd
                grad_w += (g.T @ hd[i:i + rows]).float()
        return grad_h, grad_w.to(weight.dtype), None, None, None, None, None


def _logits_grad(logits: torch.Tensor, lse: torch.Tensor, y: torch.Tensor, valid: torch.Tensor,
                 scale: torch.Tensor | float) -> torch.Tensor:
    """``(softmax - onehot(y)) * scale`` for the valid rows of a chunk, zero for the others, in fp32, made in the
    logits' own buffer (a chunk holds one ``rows x vocab`` fp32 array and its copy in the products' dtype)."""
    g = logits.sub_(lse.unsqueeze(1)).exp_()
    g.scatter_add_(1, y.unsqueeze(1), torch.full_like(lse, -1.0).unsqueeze(1))
    return g.mul_(valid.to(logits.dtype).mul_(scale).unsqueeze(1))  # an ignored row's weight is 0
