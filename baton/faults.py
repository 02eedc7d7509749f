"""Named moments of a session, for the chaos tests: off (one environment lookup) unless a test asks.

The reliability tests kill a real training process with SIGKILL at random moments. On a small model
most phases of the checkpoint cycle last a millisecond, so a purely random delay would almost never land
in "while writing the pointer" or "while pruning". Each phase therefore calls ``point(name)``:

- ``BATON_FAULT_TRACE=<file>`` appends ``<name> <step> <pid> <thread>`` to the file at every point (so a
  test knows which phase a kill hit);
- ``BATON_FAULT_PAUSE=<name>=<seconds>[,<name>=<seconds>...]`` sleeps at the named points, widening
  that window so a kill can be aimed into it; ``<name>@<step>=<seconds>`` only where the point passes that
  step (a kill aimed at the last checkpoint's cycle need not wait at every earlier one).

Nothing else changes: the code between points runs as in production, and the kill is a real SIGKILL.
"""

from __future__ import annotations

import os
import threading
import time

TRACE_ENV = "BATON_FAULT_TRACE"
PAUSE_ENV = "BATON_FAULT_PAUSE"

# The points, in the order a checkpoint cycle passes them.
POINTS = (
    "step",  # an optimizer step begins
    "save",  # the local checkpoint folder is about to be written
    "save.file",  # between two files of the local checkpoint
    "upload",  # before each file is put into the store
    "verify",  # the store's listing and read-back begin
    "pointer",  # the pointer is about to be written
    "pointer.readback",  # the pointer is written and about to be read back
    "prune",  # the local copy is gone; retention is about to list and delete old checkpoints
    "prune.delete",  # before each old checkpoint is deleted
    "resume.moved",  # a push left unfinished by a killed session is now verified; its folder moved to be resumed
    # The dataset's relay (baton.data.publish, baton.data.pull), not part of the checkpoint cycle.
    "data.publish",  # before each data file is put into data.url, and before its manifest
    "data.pull",  # before each data file is downloaded from data.url
    "rollback",  # a loss spike decided a rollback; the checkpoint before it is about to be loaded
    "rollback.loaded",  # the rollback loaded that checkpoint; its record is about to be written
    "publish.card",  # a published model's files are verified; its model card is about to be written
    # The run's lease (baton.store.lease), inside its conditional writes.
    "lease.written",  # a conditional write of the lease landed; the writer has not yet used its answer
    "lease.acquired",  # the lease is this session's; the pointer is about to be sealed with its epoch
)

_pauses: tuple[str, dict[str, float]] | None = None


def point(name: str, step: int | None = None) -> None:
    trace, pause = os.environ.get(TRACE_ENV), os.environ.get(PAUSE_ENV)
    if not trace and not pause:
        return
    if trace:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(f"{name} {'-' if step is None else step} {os.getpid()} {threading.current_thread().name}\n")
    if pause:
        table = _parse(pause)
        seconds = table.get(f"{name}@{step}", table.get(name))
        if seconds:
            time.sleep(seconds)


def _parse(spec: str) -> dict[str, float]:
    global _pauses
    if _pauses is None or _pauses[0] != spec:
        table = {}
        for item in spec.split(","):
            name, _, seconds = item.partition("=")
            if name.strip():
                table[name.strip()] = float(seconds or 0)
        _pauses = (spec, table)
    return _pauses[1]
