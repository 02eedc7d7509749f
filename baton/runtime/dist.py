"""torch.distributed as launched by torchrun: process group, rank info, cross-rank agreement.

A single process (no torchrun) is world size 1 and every helper here is then a no-op, so the training
code has one path. The launcher side (starting torchrun, reporting failures) is in ``baton.runtime.launch``.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ..errors import BatonError, ConfigError
from . import cuda

T = TypeVar("T")

# Waiting on rank 0's store work (pulling, pushing and verifying a multi-GB checkpoint to a slow store)
# can last far longer than any step's collective should; those waits get their own timeout.
STORE_WAIT_S = 3 * 3600

# Object collectives (errors, pointers, RNG states) run on a gloo side group: on CPU, off the GPU stream,
# and with the long store-wait timeout. Tensor reductions of the step use the default group.
_OBJ_GROUP: Any = None


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


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def env_rank() -> int:
    return int(os.environ.get("RANK", 0))


def is_local_main() -> bool:
    """Whether this process is its node's first (torchrun's LOCAL_RANK 0, or a single process)."""
    return int(os.environ.get("LOCAL_RANK", 0)) == 0


def node_suffix() -> str:
    """Empty on a single node, else "-node<N>" (torchrun's GROUP_RANK): for files each node writes locally."""
    local, world = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    if not local or not world or int(local) == int(world):
        return ""
    return f"-node{os.environ.get('GROUP_RANK', '0')}"


def init(device_type: str, timeout_s: float = 600.0) -> DistInfo:
    """Join the process group torchrun describes in the environment (gloo on CPU, NCCL on CUDA)."""
    global _OBJ_GROUP
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank)
    if not under_torchrun():
        return DistInfo()
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        visible = torch.cuda.device_count()
        if local_rank >= visible:  # else an "invalid device ordinal" traceback from every extra rank
            raise ConfigError(f"this node starts more ranks than it has GPUs: local rank {local_rank}, and "
                              f"{visible} CUDA GPU{'' if visible == 1 else 's'} visible (start at most {visible} "
                              f"process{'' if visible == 1 else 'es'} per node: --nproc {visible})")
        cuda.set_current(local_rank)
    # A bounded timeout: a rank that hangs must not leave the others waiting forever in a collective.
    # (A rank that dies is noticed sooner: gloo sees the closed connection, torchrun tears the group down.)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    _OBJ_GROUP = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=max(timeout_s, STORE_WAIT_S)))
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank)


def shutdown() -> None:
    global _OBJ_GROUP
    if dist.is_initialized():
        dist.destroy_process_group()
    _OBJ_GROUP = None


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


def sum_(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over ranks in place, where it lies (on the GPU: no copy to the host, no wait for it)."""
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def any_true(flag: bool, device: torch.device) -> bool:
    """Agree on a stop decision: if any rank wants to stop, all stop at this boundary."""
    return maximum(1.0 if flag else 0.0, device) > 0


def broadcast(obj: Any, src: int = 0) -> Any:
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=_OBJ_GROUP)
    return box[0]


def gather(obj: Any) -> list[Any]:
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=_OBJ_GROUP)
    return out


def on_main(fn: Callable[[], T], local: bool = False) -> T | None:
    """Run ``fn`` on rank 0 (``local``: on each node's local rank 0) while the other ranks wait, and hand its
    result to every rank (``local``: ``fn``'s ranks get their result, the others None). An error there is
    raised on every rank: a ``BatonError`` as the same class with the same message, anything else as a
    RuntimeError naming the rank (that rank raises the original, with its traceback).

    The others wait in a collective of the object group, whose timeout is the long store wait's, never in the
    step's: the work may be a pull, a push or an upload of any length. A single process just calls ``fn``.
    """
    if not dist.is_initialized():
        return fn()
    rank = dist.get_rank()
    runs = int(os.environ.get("LOCAL_RANK", 0)) == 0 if local else rank == 0
    result: Any = None
    failure: BaseException | None = None
    if runs:
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - every rank must learn of it, or they wait forever
            failure = e
    report = None if failure is None else (
        (type(failure), str(failure)) if isinstance(failure, BatonError)
        else (RuntimeError, f"rank {rank} failed: {type(failure).__name__}: {failure}"))
    if local:
        reports = gather(report)
    else:
        result, report = broadcast((result, report))
        reports = [report]
    if failure is not None:
        raise failure
    first = next((r for r in reports if r is not None), None)
    if first is not None:
        kind, message = first
        err = kind.__new__(kind)  # the class itself, without its own __init__'s arguments
        Exception.__init__(err, message)
        raise err
    return result


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier(group=_OBJ_GROUP)


def fault_point(rank: int, step: int) -> None:
    """Fail on purpose where ``BATON_FAULT_AT=RANK:STEP[:hang]`` says (how the failure paths are proven):
    raise, or with ``:hang`` stop responding, so the other ranks meet the collective timeout.

    Unset, as in every real run, this is one dictionary lookup per step.
    """
    spec = os.environ.get("BATON_FAULT_AT")
    if not spec:
        return
    want_rank, want_step, *mode = spec.split(":")
    if rank == int(want_rank) and step == int(want_step):
        if mode == ["hang"]:
            while True:
                time.sleep(3600)
        raise RuntimeError(f"injected failure on rank {rank} at step {step} (BATON_FAULT_AT={spec})")
