"""Will the training state fit? Said before the model is built, not by the OOM killer half-way through."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import torch

from ..errors import ConfigError

# fp32 master weights, fp32 gradients and AdamW's two fp32 moments. Activations come on top and depend
# on the micro-batch, so this is a floor: a state above the free memory can never train.
BYTES_PER_PARAM = 16


def state_bytes(n_params: int, parallel: str, world: int) -> int:
    """Bytes one rank holds for weights, gradients and optimizer moments."""
    if parallel == "fsdp":
        # Every rank builds (and loads a checkpoint into) the whole fp32 model before it is sharded.
        return max(4 * n_params, BYTES_PER_PARAM * n_params // world)
    return BYTES_PER_PARAM * n_params


def free_bytes(device: torch.device, meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Memory one rank may use on ``device``; None where it cannot be read."""
    if device.type == "cuda":
        from . import cuda

        return cuda.free_memory(device)
    if device.type != "cpu" or not meminfo.is_file():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            # Ranks on one machine share its memory.
            return int(line.split()[1]) * 1024 // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return None


def shortfall(n_params: int, parallel: str, world: int, device: torch.device, free: int | None = None) -> str | None:
    """Why the state cannot fit on this rank, with the fix; None when it fits or the free memory is unknown."""
    free = free_bytes(device) if free is None else free
    need = state_bytes(n_params, parallel, world)
    if free is None or need <= free:
        return None
    gib = 2**30
    fix = "a smaller model (model.hidden, model.n_layers)"
    if parallel != "fsdp":
        fix += ", train.parallel=fsdp across several GPUs"
    return (f"the model has {n_params:,} parameters: its weights, gradients and AdamW moments alone need "
            f"{need / gib:.1f} GiB per rank, but {device.type} has {free / gib:.1f} GiB free per rank "
            f"(use {fix}, or a machine with more memory)")


def check_fits(n_params: int, parallel: str, world: int, device: torch.device) -> None:
    """Raise ConfigError on every rank when the state cannot fit on any one of them."""
    from . import dist

    why = shortfall(n_params, parallel, world, device)
    if dist.any_true(why is not None, device):
        raise ConfigError(why or "another rank has too little memory for the model's training state (see its log)")


def rss_peak() -> int:
    """This process's resident-set high-water mark, bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def is_oom(e: BaseException) -> bool:
    """Whether ``e`` says that memory ran out, in any of the ways a step can: the caching allocator's
    ``OutOfMemoryError``, a kernel's or cuBLAS/cuDNN's own allocation failing (a plain RuntimeError, or
    torch's AcceleratorError, naming it), or the host's ``MemoryError``."""
    if isinstance(e, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(k in text for k in (
        "out of memory", "can't allocate memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed",
        "cudnn_status_not_enough_workspace"))
