"""Work a training session does on the side (publishing a revision, evaluating it, tracking, reporting): it
fails soft. Whatever goes wrong there, and whatever kind of exception says so (a store's, an optional
library's own ``ValueError``, a bug), becomes one warning line naming the job and how to redo it; the run's
own state is never at stake there, so training goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def soft(job: str, fix: str, fn: Callable[[], T]) -> T | None:
    """``fn()``; on any Exception a warning naming ``job``, its cause and ``fix``, and None."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a side job's failure of any kind is reported, never fatal
        said = " ".join(f"{type(e).__name__}: {e}".split())
        log.warning("%s failed (%s); training goes on: %s", job, said[:500], fix)
        return None
