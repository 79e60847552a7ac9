"""Waiting for another party: retry a call while the peer is down or not ready yet."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

import httpx

from fedgl_secure.errors import FedGLError, ServiceError

T = TypeVar("T")


class PeerUnavailable(FedGLError):
    """A peer did not answer (or stayed not ready) within the waiting time."""


class StopRequested(FedGLError):
    """The node was asked to stop (SIGTERM, SIGINT) while it was still waiting for a peer."""


def retry_until_ready(
    call: Callable[[], T],
    what: str,
    log,
    timeout: float = 300.0,
    interval: float = 0.5,
    retry_on: tuple[type[BaseException], ...] = (),
    stop: threading.Event | None = None,
) -> T:
    """``call()`` until it succeeds; transport errors (peer down, restarting) and ``retry_on`` are retried.

    Anything else — a refusal, a 4xx — is a real answer and is raised at once. Once ``stop`` is set
    the wait ends with ``StopRequested`` (a node told to stop must not sit out the whole timeout).
    """
    transient = (httpx.TransportError, ServiceError, *retry_on)
    deadline = time.monotonic() + timeout
    attempt = 0
    while True:
        try:
            return call()
        except transient as error:
            if isinstance(error, ServiceError) and error.status is not None and error.status < 500:
                raise
            attempt += 1
            if time.monotonic() >= deadline:
                raise PeerUnavailable(f"{what} did not become ready within {timeout:.0f} s: {error}") from None
            if attempt == 1 or attempt % 20 == 0:
                log.info("peer.waiting", peer=what, error=str(error)[:200], attempt=attempt)
            if stop is None:
                time.sleep(interval)
            elif stop.wait(interval):
                raise StopRequested(f"stopped while waiting for {what}") from None
