"""Model FLOPs and model FLOPs utilisation (MFU), shared by the training progress, the run summary and
`baton bench`.

Convention (PaLM, appendix B; nanoGPT's ``estimate_mfu``): a token costs ``6 N + 12 L T d`` FLOPs for a
forward and backward pass, where

- ``N`` counts the parameters that take part in a matrix multiply: every block's attention and MLP
  weights plus the output head (``vocab x hidden``, counted even when it is tied to the input embedding,
  because the head's matmul runs either way). The input embedding is a table lookup and the norms are
  element-wise, so neither is counted;
- ``12 L T d`` is the attention itself (``QK^T`` and ``AV``: 2 matmuls x 2 FLOPs x ``T d`` per layer
  forward, x3 for forward + backward), with ``T`` the sequence length and ``d`` the query width.
  Causal masking is not subtracted, as in PaLM; ``causal=True`` halves the term (what a FlashAttention
  kernel actually computes) for comparisons with figures that use that convention.

Recomputation by activation checkpointing is not counted: MFU measures useful model work, so turning
checkpointing on lowers MFU by its cost instead of hiding it.

Peak FLOP/s are dense (no structured sparsity) vendor datasheet figures per GPU, by precision. A GPU not
in the table, and every CPU, has no peak here: MFU is then ``None`` (null in JSON) rather than a number
against a peak nobody can vouch for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..config import ModelConfig

T = 1e12

# (name pattern, 16-bit tensor peak, TF32 tensor peak, plain FP32 peak), FLOP/s, dense, from NVIDIA
# datasheets. Order matters: the first pattern that matches the device name wins.
PEAKS: tuple[tuple[str, float | None, float | None, float | None], ...] = (
    (r"GH200", 989.4 * T, 494.7 * T, 66.9 * T),
    (r"H200.*NVL", 835.5 * T, 417.5 * T, 60.0 * T),
    (r"H200", 989.4 * T, 494.7 * T, 66.9 * T),
    (r"H100.*(PCIe|PCIE)", 756.5 * T, 378.0 * T, 51.2 * T),
    (r"H100.*NVL", 835.5 * T, 417.5 * T, 60.0 * T),
    (r"H100", 989.4 * T, 494.7 * T, 66.9 * T),  # SXM ("NVIDIA H100 80GB HBM3")
    (r"B200", 2250.0 * T, 1100.0 * T, 75.0 * T),
    (r"A100", 312.0 * T, 156.0 * T, 19.5 * T),
    (r"L40S", 362.05 * T, 183.0 * T, 91.6 * T),
    (r"L40\b", 181.05 * T, 90.5 * T, 90.5 * T),
    (r"\bL4\b", 121.0 * T, 60.0 * T, 30.3 * T),
    (r"RTX A6000", 154.8 * T, 77.4 * T, 38.7 * T),
    (r"RTX 4090", 165.2 * T, 82.6 * T, 82.6 * T),
    (r"RTX 3090", 71.0 * T, 35.6 * T, 35.6 * T),
    (r"V100.*(PCIe|PCIE)", 112.0 * T, None, 14.0 * T),
    (r"V100", 125.0 * T, None, 15.7 * T),
    (r"\bT4\b", 65.0 * T, None, 8.1 * T),  # Turing: fp16 tensor cores, no bf16
    (r"P100", 18.7 * T, None, 9.3 * T),  # Pascal: no tensor cores; fp16 at twice fp32
)

# GPUs whose tensor cores run bf16 (Ampere and newer); bf16 elsewhere is emulated and has no peak.
BF16_PATTERNS = (r"GH200", r"H200", r"H100", r"B200", r"A100", r"L40", r"\bL4\b", r"RTX A6000", r"RTX 4090",
                 r"RTX 3090")


def matmul_params(m: ModelConfig) -> int:
    """Parameters that take part in a matrix multiply per token (blocks + output head)."""
    head_dim = m.hidden // m.n_heads
    kv = m.n_kv_heads * head_dim
    per_layer = 2 * m.hidden * m.hidden + 2 * m.hidden * kv + 3 * m.hidden * m.ffn
    return m.n_layers * per_layer + m.vocab_size * m.hidden


def flops_per_token(m: ModelConfig, seq_len: int, causal: bool = False) -> int:
    """Training FLOPs (forward + backward) per token: ``6 N + 12 L T d`` (see the module docstring)."""
    attn = 12 * m.n_layers * seq_len * m.hidden
    return 6 * matmul_params(m) + (attn // 2 if causal else attn)


def peak_flops(device_name: str, precision: str, tf32: bool = True) -> float | None:
    """Dense peak FLOP/s of one GPU at ``precision`` (fp32 | bf16 | fp16), or None when unknown.

    ``tf32``: whether fp32 matmuls may use TF32 tensor cores (``torch.backends.cuda.matmul.allow_tf32``).
    """
    for pattern, p16, ptf32, p32 in PEAKS:
        if re.search(pattern, device_name):
            if precision == "fp16":
                return p16
            if precision == "bf16":
                return p16 if any(re.search(b, device_name) for b in BF16_PATTERNS) else None
            return (ptf32 or p32) if tf32 else p32
    return None


def mfu(tokens_per_s: float, flops_per_tok: float, peak_per_device: float | None, devices: int = 1) -> float | None:
    """Achieved model FLOP/s over the peak of all ``devices`` together (None without a peak)."""
    if not peak_per_device or tokens_per_s <= 0:
        return None
    return tokens_per_s * flops_per_tok / (peak_per_device * devices)


@dataclass(frozen=True)
class FlopsInfo:
    """What a session knows about its FLOPs: fixed at start, applied to each measured rate."""

    flops_per_token: int
    device_name: str
    peak_per_device: float | None  # FLOP/s, or None (CPU, or a GPU not in the table)
    devices: int

    def mfu(self, tokens_per_s: float) -> float | None:
        return mfu(tokens_per_s, self.flops_per_token, self.peak_per_device, self.devices)

    def summary(self, tokens_per_s: float) -> dict:
        u = self.mfu(tokens_per_s)
        return {
            "mfu": None if u is None else round(u, 4),
            "model_flops_per_token": self.flops_per_token,
            "achieved_tflops": round(tokens_per_s * self.flops_per_token / T, 3),
            "peak_tflops_per_device": None if self.peak_per_device is None else self.peak_per_device / T,
            "flops_device": self.device_name,
        }


def tf32_matmul() -> bool:
    """Whether fp32 matmuls may run on TF32 tensor cores.

    torch 2.9 added ``torch.backends.cuda.matmul.fp32_precision`` ("ieee" | "tf32" | "none": not set), and once
    it is set (transformers sets it on import there) reading the old ``allow_tf32`` raises a RuntimeError about
    mixing the two APIs. So the new switch is read first, and the old one only where the new one is unset.
    """
    import torch

    matmul = torch.backends.cuda.matmul
    new = getattr(matmul, "fp32_precision", None)
    if new in ("tf32", "ieee"):
        return new == "tf32"
    try:
        return bool(matmul.allow_tf32)
    except RuntimeError:  # the two APIs mixed in a way neither answers: claim the lower (plain fp32) peak
        return False


def session_flops(m: ModelConfig, seq_len: int, device, precision: str, devices: int) -> FlopsInfo:
    """FLOPs bookkeeping for a training session on ``device`` (a torch.device)."""

    if device.type == "cuda":
        from . import cuda

        name = cuda.name(device)
        peak = peak_flops(name, precision, tf32=tf32_matmul())
    else:
        import platform

        name, peak = f"cpu ({platform.machine()})", None
    return FlopsInfo(flops_per_token(m, seq_len), name, peak, devices)
