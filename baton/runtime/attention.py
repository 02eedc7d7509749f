"""Which attention kernel a session runs (``model.attn = "auto"``), and whether the one configured can run
on the session's device, decided once at session start.

auto: SDPA on the CPU and on Ampere or newer GPUs, where it dispatches to its flash / cuDNN / memory-efficient
kernels (the eager implementation materialises the attention matrix: 3x slower on an H200 at seq 2048). On
older GPUs (a T4 is 7.5) SDPA has no flash kernel for these head sizes and eager can win (+52 % at seq 1024
in the reference run), so the session measures both at its own shape and takes the faster.

transformers checks only that the flash-attn package imports; on a GPU older than Ampere (a T4 is
compute capability 7.5) FlashAttention-2 then fails at the first forward, after the data, the model and
the micro-batch probe were already set up. The decision is a pure function of the device kind, its compute
capability and the package, so it is tested without a GPU.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from ..config import Attn, Config
from ..errors import ConfigError
from . import cuda

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
        cap, name = cuda.capability(device), cuda.name(device)
    return refusal(attn, device.type, cap, attn == "flash_attention_2" and flash_installed(), name or "this GPU")


def check(attn: str, device: torch.device) -> None:
    why = device_refusal(attn, device)
    if why is not None:
        raise ConfigError(why)


# auto takes SDPA without measuring from this compute capability on.
SDPA_MIN_CAPABILITY = (8, 0)


def resolve(cfg: Config, device: torch.device, dtype: torch.dtype | None) -> tuple[Attn, str | None]:
    """(the implementation ``cfg.model.attn`` is on ``device``, how auto decided or None when it was not auto).
    ``dtype``: the autocast dtype the session trains under, which the measurement uses."""
    attn = cfg.model.attn
    if attn != "auto":
        return attn, None
    if device.type != "cuda":
        return "sdpa", f"auto -> sdpa ({device.type})"
    cap = cuda.capability(device)
    if cap >= SDPA_MIN_CAPABILITY:
        return "sdpa", f"auto -> sdpa (compute capability {cap[0]}.{cap[1]})"
    candidates: tuple[Attn, ...] = ("sdpa", "eager")
    seconds = {impl: measure(cfg, impl, device, dtype) for impl in candidates}
    best = min(candidates, key=lambda k: seconds[k])
    said = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in seconds.items())
    return best, f"auto -> {best} (compute capability {cap[0]}.{cap[1]}; forward + backward at the session's shape: {said})"


def measure(cfg: Config, impl: Attn, device: torch.device, dtype: torch.dtype | None, repeats: int = 3) -> float:
    """Seconds of one forward + backward of a throwaway model with ``impl`` at the session's sequence length
    and micro-batch (1 when that is still auto): the best of ``repeats`` after one untimed warm-up."""
    import dataclasses
    import time
    from contextlib import nullcontext

    from ..model.llama import build_model

    mb = cfg.train.micro_batch if isinstance(cfg.train.micro_batch, int) else 1
    model = build_model(dataclasses.replace(cfg.model, attn=impl), device)
    x = torch.zeros((mb, cfg.data.seq_len), dtype=torch.long, device=device)
    best = float("inf")
    try:
        for i in range(repeats + 1):
            cuda.synchronize(device)
            t0 = time.perf_counter()
            with torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext():
                loss = model(input_ids=x).logits.float().mean()
            loss.backward()
            cuda.synchronize(device)
            if i:
                best = min(best, time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
    finally:
        del model, x
        cuda.empty_cache()
    return best


# SDPA's kernels in the order auto asks for them from this compute capability on: on Hopper (sm90) cuDNN's
# fused attention is the fastest SDPA kernel for these head sizes, then FlashAttention-2 (torch's own order puts
# flash first and cuDNN last). A kernel that cannot run a shape passes it to the next, as SDPA always does.
SDPA_PRIORITY_MIN_CAPABILITY = (9, 0)
SDPA_PRIORITY = ("cudnn", "flash", "efficient", "math")
_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
             "math": "MATH"}


def sdpa_priority(attn: str, device_type: str, capability: tuple[int, int] | None, deterministic: bool,
                  settable: bool) -> tuple[str, ...] | None:
    """The SDPA kernel order ``model.attn = "auto"`` sets, or None to leave torch's own: only on CUDA GPUs of
    compute capability 9.0 and newer, where this torch can set an order (``sdpa_kernel(set_priority=)``, torch
    2.6+), and not under ``train.deterministic`` (whose flash backward is the deterministic one it relies on)."""
    if attn != "auto" or device_type != "cuda" or not settable or deterministic:
        return None
    if capability is None or tuple(capability) < SDPA_PRIORITY_MIN_CAPABILITY:
        return None
    return SDPA_PRIORITY


def priority_settable() -> bool:
    """Whether this torch's ``sdpa_kernel`` takes an order (``set_priority``)."""
    import inspect

    try:
        from torch.nn.attention import sdpa_kernel
    except ImportError:
        return False
    return "set_priority" in inspect.signature(sdpa_kernel).parameters


class KernelOrder:
    """SDPA's kernel order for the session's lifetime (a process-wide setting of torch): entered once the
    session resolved its attention, left when the session closes, so a notebook's later work gets torch's
    own order back."""

    def __init__(self) -> None:
        self._ctx: Any = None

    def enter(self, order: tuple[str, ...]) -> None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.leave()
        ctx = sdpa_kernel([getattr(SDPBackend, _BACKENDS[k]) for k in order], set_priority=True)
        ctx.__enter__()
        self._ctx = ctx

    def leave(self) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.__exit__(None, None, None)


ORDER = KernelOrder()
