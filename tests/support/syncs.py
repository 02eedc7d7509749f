"""Counting the reads from the device that a piece of code makes, on a CPU.

On a GPU each ``.item()``, ``.tolist()``, ``.cpu()``, ``float(t)``, ``int(t)`` or ``bool(t)`` of a device tensor
waits for every kernel queued before it (``torch.cuda.set_sync_debug_mode`` flags them; benchmarks/gpu_check.py
counts them there). On a CPU nothing waits, so the calls themselves are counted: the methods are wrapped on
``torch.Tensor`` for the duration, and each call is recorded with the line of baton (or torch) that made it.
``.numpy()`` is not counted: baton calls it only on host tensors (the data rows), and on a device tensor it
raises instead of reading.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import torch

READS = ("item", "tolist", "cpu", "__float__", "__int__", "__bool__", "__index__")


@contextmanager
def counted_reads() -> Iterator[list[str]]:
    """Yields a list that fills with one entry per read while the block runs: ``"<method> at <folder>/<file>:<line>"``
    of the code that made it."""
    calls: list[str] = []
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(name: str, method):
        def counted(self, *args, **kwargs):
            calls.append(f"{name} at {_caller()}")
            return method(self, *args, **kwargs)
        return counted

    for name, method in saved.items():
        setattr(torch.Tensor, name, wrap(name, method))
    try:
        yield calls
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.endswith("support/syncs.py"):
            return f"{frame.filename.rsplit('/', 2)[-2]}/{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
    return "?"
