"""Bounded retries for store calls: transient faults are retried with backoff, permanent ones stop at once.

Each backend classifies its own exceptions (a dropped connection, a timeout, 429 and 5xx are transient; a
missing bucket or repository, 401 and 403 are permanent) into ``Transient`` or a ``StoreError`` carrying
the fix; ``call`` does the rest. The bound is on both the number of attempts and the wall time, so a
store that is down ends the push in minutes, not hours.
"""

from __future__ import annotations

import logging
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..errors import StoreError

log = logging.getLogger(__name__)
T = TypeVar("T")


# getaddrinfo's answers for a name that has no address: a wrong host, or a machine with no working DNS.
# ("Temporary failure in name resolution", EAI_AGAIN, stays a fault worth another try.)
_NO_SUCH_NAME = {getattr(socket, n) for n in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, n)}


def unresolved_host(e: BaseException) -> str | None:
    """The resolver's words when ``e`` (or what caused it) is a host name that does not resolve, else None."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, socket.gaierror) and seen.errno in _NO_SUCH_NAME:
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return None


def unresolved_error(e: BaseException, reached: bool, host: str) -> StoreError | None:
    """A store whose host has not resolved once in this process: a wrong name, or a machine without a network.
    Retrying that for minutes only hides it, so it is said at once. Once the store has answered, a name that stops
    resolving is a hiccup of the resolver, retried like a dropped connection (a push at a session's end must
    not give up on one)."""
    why = None if reached else unresolved_host(e)
    if why is None:
        return None
    return StoreError(f"the host {host} does not resolve ({why}): check the host name (store.url, its endpoint) and "
                      "this machine's network and DNS")


class Transient(Exception):
    """A failure worth another try (the message is safe to print: no credentials)."""


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6  # tries in all, the first included
    max_seconds: float = 300.0  # no new attempt starts after this much time has passed
    base: float = 1.0  # first backoff in seconds; doubles each attempt
    cap: float = 30.0  # longest single backoff
    # A request that hears nothing from the server for this long is a dropped connection, retried like one.
    # Without a bound a stalled server holds a push, and with it the end of the session, indefinitely.
    request_timeout: float = 120.0

    @classmethod
    def from_config(cls, store) -> RetryPolicy:
        """From a ``StoreConfig`` (``retries``, ``retry_seconds``, ``request_timeout``)."""
        return cls(attempts=store.retries, max_seconds=store.retry_seconds, request_timeout=store.request_timeout)

    def delay(self, attempt: int, rng: random.Random) -> float:
        # "Full jitter": uniform in [0, base * 2**attempt], so many clients retrying do not stampede.
        return rng.uniform(0, min(self.cap, self.base * (2 ** attempt)))


def call(fn: Callable[[], T], what: str, where: str, classify: Callable[[Exception], Exception],
         policy: RetryPolicy, rng: random.Random | None = None) -> T:
    """Run ``fn``; ``classify`` maps its exception to ``Transient`` (retry), a StoreError whose message is
    the cause and what to check (raised at once, prefixed with the operation and the store), or anything
    else (re-raised as it was: a bug, not a store fault).

    ``what`` names the operation and ``where`` the store (as ``describe()`` prints it) in the final error.
    """
    rng = rng or random.Random()
    t0 = time.monotonic()
    attempt = 0
    while True:
        try:
            return fn()
        except StoreError:
            raise
        except Exception as e:  # noqa: BLE001 - every exception is classified, none is swallowed
            err = classify(e)
            if isinstance(err, StoreError):
                raise type(err)(f"{what} failed in {where}: {err}") from None
            if not isinstance(err, Transient):
                raise
            attempt += 1
            elapsed = time.monotonic() - t0
            wait = policy.delay(attempt - 1, rng)
            if attempt >= policy.attempts or elapsed + wait > policy.max_seconds:
                raise StoreError(
                    f"{what} failed in {where} after {attempt} attempt(s) over {elapsed:.1f}s: {err} "
                    "(the store looks down or unreachable; check the endpoint and network, then rerun; "
                    "store.retries and store.retry_seconds bound the retrying)"
                ) from None
            log.warning("%s in %s failed (%s); retry %d/%d in %.1fs", what, where, err, attempt,
                        policy.attempts - 1, wait)
            time.sleep(wait)
