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


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and every process descended from it, as a machine that vanishes takes them all: the
    launcher's agent and ranks each start a session of their own, so the launcher's process group alone misses
    them. Stopped first, so none forks or reaps while the tree is read. Returns the pids killed."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    for p in tree:
        try:
            p.send_signal(signal.SIGSTOP)
        except psutil.NoSuchProcess:
            pass
    tree += [c for p in list(tree) for c in _children(p) if c not in tree]
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=30)
    return [p.pid for p in tree]


def _children(p) -> list:
    import psutil

    try:
        return p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
