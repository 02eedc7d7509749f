"""Which device a process trains on."""

from __future__ import annotations

import torch

from ..errors import ConfigError
from . import cuda


def pick_device(spec: str) -> torch.device:
    if spec == "auto":
        return cuda.indexed() if torch.cuda.is_available() else torch.device("cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={spec!r} but no CUDA GPU is visible (use train.device='cpu' or 'auto')")
    device = torch.device(spec)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise ConfigError(f"train.device={spec!r} but {n} CUDA GPU{'' if n == 1 else 's'} {'is' if n == 1 else 'are'} "
                          f"visible (cuda:0 to cuda:{n - 1}; check CUDA_VISIBLE_DEVICES)")
    # Indexed: some torch.cuda calls refuse a bare "cuda"; a device that leaves here always names its GPU.
    return cuda.indexed(device) if device.type == "cuda" else device


def rank_device(spec: str, local_rank: int, under_torchrun: bool) -> torch.device:
    """The GPU this process trains on, from ``train.device`` as written: under torchrun the one of its local
    rank (one process per GPU); in a single process the one ``train.device`` names (``cuda`` or ``auto``: the
    current GPU, 0 in a fresh process), so two single-GPU runs on one machine can each have their own. It
    becomes the current device: kernels and memory counters that take no device argument then mean this one.

    It reads the spec, not a device ``pick_device`` indexed before ``dist.init`` set each rank's current GPU:
    that said ``cuda:0`` on every rank for ``auto``, which looked like a config naming one GPU."""
    device = pick_device(spec)
    if device.type != "cuda":
        return device
    if under_torchrun:
        named = None if spec in ("auto", "cuda") else torch.device(spec).index
        if named is not None and named != local_rank:
            raise ConfigError(f"train.device='cuda:{named}' names one GPU, but under torchrun each rank trains "
                              f"on the GPU of its local rank (this one: cuda:{local_rank}); set train.device = "
                              "\"cuda\" or \"auto\", and choose the GPUs with CUDA_VISIBLE_DEVICES")
        # dist.init has checked that this node has a GPU for every local rank
        return cuda.set_current(local_rank)
    return cuda.set_current(device)
