"""torchrun's agent (``torch.distributed.run``), with its own failure report left to baton's launcher.

torchrun ends a run in which a rank failed by raising ``ChildFailedError`` out of its main: its own
traceback and a table of exit codes, printed after what the ranks said, plus log lines about each
process it stopped. The launcher reads every rank's log and reports a failure itself, so here:

- every rank that failed stopped on a user error (exit status 2; the others at most stopped by torchrun's
  SIGTERM as it tore the group down): exit 2 and print nothing, the launcher says the error in one line;
- anything else (a rank's internal error, a rank killed by a signal): print torchrun's lines about the
  processes it saw fail, exit 1, and the launcher reports each rank with its log.

Run as ``python -m baton.runtime.agent <torchrun options> -m baton.cli train ...``.
"""

from __future__ import annotations

import logging
import signal
import sys

# The messages about failed and stopped processes: said by baton's report or discarded with a user error.
PROCESS_LOGGER = "torch.distributed.elastic.multiprocessing.api"
USER_ERROR = 2


class _Held(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        self.records.append(record)
        return False


def user_error_only(exitcodes: list[int]) -> bool:
    """True when a rank stopped on a user error and every other failure was torchrun stopping a rank."""
    return USER_ERROR in exitcodes and all(c in (USER_ERROR, -signal.SIGTERM) for c in exitcodes)


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    logger = logging.getLogger(PROCESS_LOGGER)
    held = _Held()
    logger.addFilter(held)
    try:
        torchrun(argv)
        status = 0
    except ChildFailedError as e:
        status = USER_ERROR if user_error_only([f.exitcode for f in e.failures.values()]) else 1
    except SignalException as e:
        # The launcher passed on a stop signal; the ranks' logs say whether each one checkpointed.
        status = 128 + int(e.sigval)
    finally:
        logger.removeFilter(held)
    if status != USER_ERROR:
        for record in held.records:
            logger.handle(record)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
