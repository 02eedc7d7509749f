"""The HTTP library under ``huggingface_hub``, whichever major version is installed.

huggingface_hub 1.x talks through ``httpx``, 2.x through ``httpx2``; neither is a dependency of baton's
own. What baton needs of it (the transport errors to retry, a timeout to bound the shared client) is taken
from the module the library's own client comes from, so a store and a Hub source work on either version
and nothing imports a client library that is not there.
"""

from __future__ import annotations

import importlib
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
