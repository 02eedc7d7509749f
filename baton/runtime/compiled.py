"""``torch.compile`` that never ends a session: a function whose compilation fails runs eagerly instead.

``train.compile = auto`` turns compilation on for every CUDA session, whatever else is on: the fused loss,
activation checkpointing, either precision, any attention kernel. Not every combination compiles on every
torch (liger-kernel's fused cross-entropy inside a compiled graph fails fake-tensor propagation on some
versions, after a minute of compiling). A failure to compile is a fact about the toolchain, not about the run:
the first call that raises one of torch.compile's own errors (dynamo, fake tensors, the backend) is run
again eagerly, said in one line, and every later call goes straight to the eager function. The failed call
changed nothing (compilation happens before the graph runs), so repeating it is safe.

That holds for the backward graph too only because it is compiled with the forward: AOTAutograd otherwise
lowers it lazily, at the first ``.backward()``, outside this wrapper, where a failure would end the session.
Where torch has no switch for that (before about 2.8), a backward that fails to compile still ends it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ..reads import one_line
from . import memory

log = logging.getLogger(__name__)

# The backend train.compile uses; the tests put a failing one here to take the fallback without a GPU.
BACKEND: str | Callable = "inductor"


def is_compile_failure(e: BaseException) -> bool:
    """Whether ``e`` is torch.compile failing to build (not the computation failing, not memory running out)."""
    from torch._dynamo.exc import TorchDynamoException

    return isinstance(e, TorchDynamoException) and not memory.is_oom(e)


def _backward_with_forward() -> None:
    """AOTAutograd's backward compiled during the forward call (where a failure falls back), not lazily at the
    first ``.backward()``. Set for the process once baton compiles anything (a switch of torch's, read when a
    graph compiles; turning it on and off around every call would cost microseconds per layer per micro-batch):
    later compilations of the process compile their backward early too, which changes when, not what."""
    from torch._functorch import config as functorch_config

    if hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        functorch_config.force_non_lazy_backward_lowering = True


class CompiledOrEager:
    """``fn`` compiled with ``backend``; after a compile failure, ``fn`` itself. ``fell_back`` says why, or None."""

    def __init__(self, fn: Callable, what: str, backend: str | Callable | None = None):
        self.fn = fn
        self.what = what
        self.compiled = torch.compile(fn, backend=BACKEND if backend is None else backend)
        _backward_with_forward()
        self.fell_back: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fell_back is None:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - sorted below: only a failure to compile is taken here
                if not is_compile_failure(e):
                    raise
                self.fell_back = f"{type(e).__name__}: {one_line(e, 200)}"
                log.warning("train.compile: %s could not be compiled on torch %s (%s); this session runs it "
                            "eagerly (set train.compile = false to skip the attempt)", self.what,
                            torch.__version__, self.fell_back)
        return self.fn(*args, **kwargs)


def compiled_parts(fn: Any) -> list[CompiledOrEager]:
    """The compiled parts of a micro-loss: ``fn`` itself, or what it names in ``compiled_parts``."""
    return [f for f in getattr(fn, "compiled_parts", [fn]) if isinstance(f, CompiledOrEager)]


def fallbacks(fn: Any) -> list[str]:
    """What of ``fn`` (a CompiledOrEager, or a function naming its compiled parts in ``compiled_parts``) fell
    back to eager, and why: for the run summary."""
    return [f"{f.what}: eager ({f.fell_back})" for f in compiled_parts(fn) if f.fell_back]
