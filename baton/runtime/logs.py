"""Per-rank logging: every rank writes its own file; rank 0 (and any rank's warnings) reach stderr.

A rank that fails on a bug writes its full traceback to its own file (stderr gets one line naming the
file), and every rank ends its file
with an exit record, so the launcher can tell, rank by rank, who failed first and who exited cleanly.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from pathlib import Path

from ..guard import without_credentials

_FMT = "%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s"
# The start of a record in a rank's file; whatever follows until the next one belongs to that record.
RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[rank \d+\] ")
EXIT_RECORD = re.compile(r"\bEXIT rank=(\d+) status=(-?\d+)$")
TRACEBACK_HEAD = "Traceback (most recent call last):"
# Set by `baton train --nproc`'s launcher for its ranks: it says their user errors, once, from their logs.
LAUNCHED = "BATON_LAUNCHED"

log = logging.getLogger("baton")


def log_file(log_dir: Path, rank: int) -> Path:
    return log_dir / f"rank-{rank}.log"


def setup(rank: int = 0, log_dir: Path | None = None, verbose: bool = False) -> Path | None:
    root = logging.getLogger("baton")
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for h in list(root.handlers):
        if getattr(h, "_baton", False):
            root.removeHandler(h)
            h.close()
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    console.setFormatter(_Scrubbed("%(message)s" if rank == 0 else f"[rank {rank}] %(levelname)s %(message)s"))
    console._baton = True  # type: ignore[attr-defined]
    root.addHandler(console)
    path = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_file(log_dir, rank)
        fh = logging.FileHandler(path, encoding="utf-8", errors="backslashreplace")
        fh.setFormatter(_Scrubbed(_FMT.format(rank=rank)))
        fh._baton = True  # type: ignore[attr-defined]
        fh._baton_file = True  # type: ignore[attr-defined]
        root.addHandler(fh)
        _install_hooks(rank)
    root.propagate = False
    return path


class _Scrubbed(logging.Formatter):
    """Every line baton logs, a traceback's included, with the credentials of any URL in it replaced: a library's
    message may quote an endpoint it was given, password and all."""

    def format(self, record: logging.LogRecord) -> str:
        return without_credentials(super().format(record))


def log_failure(rank: int, exc: BaseException) -> Path:
    """A bug (or a dead peer): the whole traceback to this rank's log file, or to a crash file of its own
    when the command keeps no log; returns that file's path for the one line the terminal gets."""
    path = next((Path(h.baseFilename) for h in log.handlers if getattr(h, "_baton_file", False)), None)  # type: ignore[attr-defined]
    if path is None:
        path = _crash_file(rank)
    file_only(logging.ERROR, f"rank {rank} failed: {type(exc).__name__}: {exc}",
              exc_info=(type(exc), exc, exc.__traceback__))
    return path


def _crash_file(rank: int) -> Path:
    """A new log file for a command that keeps none (every command but train): the user's cache folder,
    or the temporary folder when that cannot be written."""
    import os
    import tempfile
    import time

    name = f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-rank{rank}.log"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "baton" / "logs"
    fh: logging.Handler
    for folder in (cache, Path(tempfile.gettempdir()) / "baton-logs"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fh = logging.FileHandler(folder / name, encoding="utf-8", errors="backslashreplace")
            break
        except OSError:
            continue
    else:  # no disk takes a write: the traceback goes to the terminal after all
        fh = logging.StreamHandler(sys.stderr)
        fh.baseFilename = "<stderr>"  # type: ignore[attr-defined]
    fh.setFormatter(_Scrubbed(_FMT.format(rank=rank)))
    fh._baton = True  # type: ignore[union-attr]
    fh._baton_file = True  # type: ignore[union-attr]
    log.addHandler(fh)
    return Path(fh.baseFilename)  # type: ignore[union-attr]


def exit_record(rank: int, status: int) -> None:
    """The last line of a rank's session in its file (files only: the console has the outcome already)."""
    file_only(logging.INFO, f"EXIT rank={rank} status={status}")


def file_only(level: int, message: str, exc_info=None) -> None:
    """A record for this rank's log file that the console has already shown in its own words."""
    record = log.makeRecord(log.name, level, __file__, 0, message, (), exc_info)
    for h in log.handlers:
        if getattr(h, "_baton_file", False):
            h.handle(record)
            h.flush()


def close_file() -> None:
    """Detach and close this rank's log file (a library call's session has ended; its console stays)."""
    for h in list(log.handlers):
        if getattr(h, "_baton_file", False):
            log.removeHandler(h)
            h.close()


def _install_hooks(rank: int) -> None:
    # An exception that escapes somewhere the CLI does not catch (a thread, interpreter shutdown) still
    # reaches this rank's file, not only a stderr that a cluster may have thrown away.
    def excepthook(tp, value, tb):
        log.error("rank %d: uncaught %s: %s", rank, tp.__name__, value, exc_info=(tp, value, tb))

    def thread_hook(args):
        if args.exc_type is SystemExit:
            return
        log.error("rank %d: uncaught %s in thread %s: %s", rank, args.exc_type.__name__,
                  getattr(args.thread, "name", "?"), args.exc_value,
                  exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    sys.excepthook = excepthook
    threading.excepthook = thread_hook
