"""The push in the background: upload and verification of a saved checkpoint while training continues.

At most one push is in flight. Starting the next one first waits for the previous one, so checkpoints
reach the store in order and a failed push is never overtaken by a later one. A failure is kept until
someone asks: the session polls at every step boundary (``failure``) and stops there, and ``wait``
re-raises it. The thread only reads the saved folder and talks to the store; it never touches the model.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class PushFailed(Exception):
    """A background push failed; ``step`` names the checkpoint, the message the store and the cause."""

    def __init__(self, step: int, message: str):
        super().__init__(message)
        self.step = step


class Pusher:
    def __init__(self, background: bool = True):
        self.background = background
        self._thread: threading.Thread | None = None
        self._step: int | None = None
        self._error: PushFailed | None = None
        self._result: Any = None

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, step: int, push: Callable[[], Any]) -> None:
        """Run ``push`` for checkpoint ``step``: in the background, or here when background is off.

        Waits for (and re-raises the failure of) the previous push first.
        """
        self.wait()
        self._step, self._result = step, None
        if not self.background:
            self._run(push)
            return
        self._thread = threading.Thread(target=self._run, args=(push,), name=f"baton-push-{step}", daemon=False)
        self._thread.start()

    def _run(self, push: Callable[[], Any]) -> None:
        if self.background:
            _lower_priority()
        try:
            self._result = push()
        except BaseException as e:  # noqa: BLE001 - every failure is reported at the next step boundary
            self._error = PushFailed(self._step or 0, f"{type(e).__name__}: {e}")
            log.error("push of checkpoint step %s failed: %s", self._step, self._error)

    def failure(self) -> PushFailed | None:
        """The failure of a push that has finished, without waiting for one still running."""
        if self.in_flight:
            return None
        return self._error

    def wait(self) -> Any:
        """Block until no push is in flight; raise PushFailed if the last one failed (once: the caller now
        owns the failure). Returns the last push's result."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        return self._result


BACKGROUND_NICE = 10


def _lower_priority() -> None:
    """Let training win the CPU: on Linux a thread has its own nice value (hashing threads it starts inherit
    it), so the push yields to the training step when they compete for a core and uses idle cores freely."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), BACKGROUND_NICE))
    except (AttributeError, OSError):  # not Linux, or not allowed: the push runs at normal priority
        pass
