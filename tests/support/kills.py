"""A real process killed at a chosen moment: started, watched until a condition holds, then SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def kill_when(cmd: list[str], done: Callable[[], bool], cwd: Path, env: dict | None = None,
              limit: float = 240) -> int:
    """Run ``cmd`` in a session of its own, SIGKILL it once ``done()`` holds (the limit only catches a hang) and
    return its process group id. A process that ends before the kill fails the test with its stderr."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        deadline = time.time() + limit
        while not done() and time.time() < deadline:
            assert p.poll() is None, f"the command ended before it could be interrupted: {p.stderr.read().decode()}"
            time.sleep(0.002)
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait()
    assert p.returncode == -signal.SIGKILL
    return p.pid
