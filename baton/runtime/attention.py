"""Whether ``model.attn`` can run on the session's device, decided once at session start.

transformers checks only that the flash-attn package imports; on a GPU older than Ampere (a T4 is
compute capability 7.5) FlashAttention-2 then fails at the first forward, after the data, the model and
the micro-batch probe were already set up. The decision is a pure function of the device kind, its compute
capability and the package, so it is tested without a GPU.
"""

from __future__ import annotations

import importlib.util

import torch

from ..errors import ConfigError

# FlashAttention-2's kernels are built for Ampere (sm80) and newer.
FLASH2_MIN_CAPABILITY = (8, 0)


def refusal(attn: str, device_type: str, capability: tuple[int, int] | None, flash_installed: bool,
            device_name: str = "this GPU") -> str | None:
    """Why ``attn`` cannot run here (one line naming the fix), or None when it can."""
    if attn != "flash_attention_2":
        return None  # eager and sdpa run on every device
    if device_type != "cuda":
        return (f"model.attn='flash_attention_2' needs a CUDA GPU, and this session runs on {device_type} "
                "(use model.attn='sdpa')")
    if capability is None or tuple(capability) < FLASH2_MIN_CAPABILITY:
        cc = "unknown" if capability is None else f"{capability[0]}.{capability[1]}"
        return (f"model.attn='flash_attention_2' needs a GPU of compute capability 8.0 or newer (Ampere+), and "
                f"{device_name} is {cc} (use model.attn='sdpa', or 'eager')")
    if not flash_installed:
        return ("model.attn='flash_attention_2' needs the flash-attn package (pip install flash-attn, or use "
                "model.attn='sdpa')")
    return None


def flash_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def device_refusal(attn: str, device: torch.device) -> str | None:
    """``refusal`` for a real device."""
    cap = name = None
    if device.type == "cuda":
        from . import cuda

        cap, name = cuda.capability(device), cuda.name(device)
    return refusal(attn, device.type, cap, attn == "flash_attention_2" and flash_installed(), name or "this GPU")


def check(attn: str, device: torch.device) -> None:
    why = device_refusal(attn, device)
    if why is not None:
        raise ConfigError(why)
