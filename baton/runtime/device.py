"""Which device a process trains on."""

from __future__ import annotations

import torch

from ..errors import ConfigError


def pick_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={spec!r} but no CUDA GPU is visible (use train.device='cpu' or 'auto')")
    return torch.device(spec)
