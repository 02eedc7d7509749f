"""Every ``torch.cuda`` call that concerns one GPU, made with that GPU's index.

Some ``torch.cuda`` functions accept a bare ``cuda`` device and take the current GPU, others
(``set_per_process_memory_fraction``, and more with each release) refuse it: "Expected a torch.device with a
specified index". Which is which is torch's business and changes; baton's rule is that no call site passes
a device as it came. The functions here turn any spec (``cuda``, ``cuda:1``, an index, None for the current
GPU) into an index first, and the rest of the package calls these, never ``torch.cuda`` with a device
(tests/runtime/test_cuda_calls.py reads the source to hold that). Device-free calls (``is_available``,
``device_count``, ``is_initialized``, ``Event``, the all-GPU RNG states) are used directly.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import torch

# A torch.device, "cuda" / "cuda:1", an index, or None for the current GPU (torch.device reads as Any here).
DeviceSpec: TypeAlias = Any


def index(device: DeviceSpec = None) -> int:
    """The GPU index ``device`` means: its own, or the current GPU's for a bare ``cuda`` or None."""
    if isinstance(device, int):
        return device
    if device is None:
        return torch.cuda.current_device()
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"{d} is not a CUDA device")
    return torch.cuda.current_device() if d.index is None else d.index


def indexed(device: DeviceSpec = None) -> torch.device:
    return torch.device("cuda", index(device))


def set_current(device: DeviceSpec) -> torch.device:
    """Make ``device`` the current GPU (kernels and counters that take no device then mean it)."""
    i = index(device)
    torch.cuda.set_device(i)
    return torch.device("cuda", i)


def capability(device: DeviceSpec = None) -> tuple[int, int]:
    major, minor = torch.cuda.get_device_capability(index(device))
    return int(major), int(minor)


def name(device: DeviceSpec = None) -> str:
    return str(torch.cuda.get_device_name(index(device)))


def total_memory(device: DeviceSpec = None) -> int:
    return int(torch.cuda.get_device_properties(index(device)).total_memory)


def free_memory(device: DeviceSpec = None) -> int:
    return int(torch.cuda.mem_get_info(index(device))[0])


def synchronize(device: DeviceSpec = None) -> None:
    torch.cuda.synchronize(index(device))


def empty_cache() -> None:
    torch.cuda.empty_cache()


def reset_peak(device: DeviceSpec = None) -> None:
    torch.cuda.reset_peak_memory_stats(index(device))


def peak_allocated(device: DeviceSpec = None) -> int:
    return int(torch.cuda.max_memory_allocated(index(device)))


def peak_reserved(device: DeviceSpec = None) -> int:
    return int(torch.cuda.max_memory_reserved(index(device)))


def limit_memory(fraction: float, device: DeviceSpec = None) -> None:
    """Cap this process's share of the GPU's memory (1.0 lifts the cap)."""
    torch.cuda.set_per_process_memory_fraction(min(1.0, fraction), index(device))


def rng_state(device: DeviceSpec = None) -> torch.Tensor:
    return torch.cuda.get_rng_state(index(device))


def set_rng_state(state: torch.Tensor, device: DeviceSpec = None) -> None:
    torch.cuda.set_rng_state(state, index(device))

