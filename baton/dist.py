"""torch.distributed as launched by torchrun: process group, rank info, cross-rank agreement.

A single process (no torchrun) is world size 1 and every helper here is then a no-op, so the training
code has one path.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def init(device_type: str, timeout_s: float = 600.0) -> DistInfo:
    if "RANK" not in os.environ or dist.is_initialized():
        if dist.is_initialized():
            return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
        return DistInfo()
    backend = "nccl" if device_type == "cuda" else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    # A bounded timeout: a rank that died must not leave the others waiting forever in a collective.
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _reduce(value: float, op: Any, device: torch.device) -> float:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return float(t.item())


def mean(value: float, device: torch.device) -> float:
    if not dist.is_initialized():
        return value
    return _reduce(value, dist.ReduceOp.SUM, device) / dist.get_world_size()


def maximum(value: float, device: torch.device) -> float:
    return _reduce(value, dist.ReduceOp.MAX, device)


def total(value: float, device: torch.device) -> float:
    return _reduce(value, dist.ReduceOp.SUM, device)


def any_true(flag: bool, device: torch.device) -> bool:
    """Agree on a stop decision: if any rank wants to stop, all stop at this boundary."""
    return maximum(1.0 if flag else 0.0, device) > 0


def broadcast(obj: Any, src: int = 0) -> Any:
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather(obj: Any) -> list[Any]:
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
