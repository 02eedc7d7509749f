"""What a training session changes for its whole process, put back when a library call returns.

`baton train` is a process of its own: what it sets (its log file, its exception hooks) it keeps to the end, where
the command's own last lines still belong in the rank's log. Called from Python, in a notebook, the process goes on
with the user's own work after ``baton.train`` returns, and nothing of the session may linger there: torch's thread
count (``train.threads``), deterministic algorithms and their environment (``train.deterministic``), the random
generators the session seeded, the exception hooks that send a thread's error to the run's log, that log file
itself, and huggingface_hub's progress bars, which a Hub store turns off.
"""

from __future__ import annotations

import os
import sys
import threading
from types import TracebackType
from typing import Any

import torch

from . import logs

_ENV = ("CUBLAS_WORKSPACE_CONFIG", "FLASH_ATTENTION_DETERMINISTIC")


class Restored:
    """``with Restored():`` around a session run from Python."""

    def __enter__(self) -> Restored:
        self.threads = torch.get_num_threads()
        self.deterministic = (torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled())
        self.cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
        self.env = {k: os.environ.get(k) for k in _ENV}
        self.cpu_rng = torch.get_rng_state()
        # Only where the user's own work has started CUDA: reading the states would otherwise start it here, on
        # GPU 0, before the session picks its device.
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() \
            else None
        self.hooks = (sys.excepthook, threading.excepthook)
        self.hub_bars_off = _hub_bars_off()
        return self

    def __exit__(self, tp: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        torch.set_num_threads(self.threads)
        torch.use_deterministic_algorithms(self.deterministic[0], warn_only=self.deterministic[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = self.cudnn
        for k, v in self.env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        sys.excepthook, threading.excepthook = self.hooks
        logs.close_file()  # the user's later lines are not the run's
        if self.hub_bars_off is False:
            from huggingface_hub.utils import enable_progress_bars

            enable_progress_bars()


def _hub_bars_off() -> Any:
    try:
        from huggingface_hub.utils import are_progress_bars_disabled
    except ImportError:
        return None
    return are_progress_bars_disabled()
