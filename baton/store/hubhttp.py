"""The HTTP library under ``huggingface_hub``, whichever major version is installed.

huggingface_hub 1.x talks through ``httpx``, 2.x through ``httpx2``; neither is a dependency of baton's
own. What baton needs of it (the transport errors to retry, a timeout to bound the shared client) is taken
from the module the library's own client comes from, so a store and a Hub source work on either version
and nothing imports a client library that is not there.
"""

from __future__ import annotations

import importlib
import logging
from functools import cache
from types import ModuleType
from typing import Any


@cache
def client_library() -> ModuleType:
    """The module (``httpx`` or ``httpx2``) whose client ``huggingface_hub.utils.get_session()`` returns."""
    from huggingface_hub.utils import get_session

    return importlib.import_module(type(get_session()).__module__.split(".")[0])


def transport_errors() -> tuple[type[BaseException], ...]:
    """Failures to reach the server at all (refused, reset, timed out): worth a retry, never a verdict."""
    lib = client_library()
    return (lib.TransportError, ConnectionError, TimeoutError)


def timeout(seconds: float) -> Any:
    """The client's timeout object: ``seconds`` for each read and write, connecting bounded at 15 s."""
    return client_library().Timeout(seconds, connect=min(15.0, seconds))


class _LibraryRetries(logging.Filter):
    """The library's own retry lines ("... thrown while requesting GET ...", "Retrying in 8s [Retry 4/5]"): baton
    retries the call around it and says so in its own words, once per attempt; these would repeat every attempt
    five times over."""

    def filter(self, record: logging.LogRecord) -> bool:
        said = record.getMessage()
        return not (record.levelno <= logging.WARNING and
                    (" thrown while requesting " in said or said.startswith(("Retrying in ", "Rate limited. Waiting"))))


_QUIET = _LibraryRetries()


def quiet_library_retries() -> None:
    """Keep the library's per-try retry lines out of baton's output (idempotent)."""
    logger = logging.getLogger("huggingface_hub.utils._http")
    if _QUIET not in logger.filters:
        logger.addFilter(_QUIET)
