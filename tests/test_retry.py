"""Waiting for a peer: what is retried, what is raised at once, and how a stop ends the wait."""

import threading

import httpx
import pytest

from fedgl_secure.consortium.retry import PeerUnavailable, StopRequested, retry_until_ready
from fedgl_secure.errors import ServiceError
from fedgl_secure.log import get_logger


def unreachable():
    raise httpx.ConnectError("connection refused")


def test_a_peer_that_comes_up_is_waited_for():
    answers = iter([httpx.ConnectError("down"), ServiceError(503, "not-ready", "starting"), None])

    def call():
        error = next(answers)
        if error is not None:
            raise error
        return "ready"

    assert retry_until_ready(call, "the peer", get_logger(), timeout=5, interval=0.01) == "ready"


def test_a_refusal_is_an_answer_not_a_reason_to_wait():
    def refuse():
        raise ServiceError(403, "forbidden", "not for you")

    with pytest.raises(ServiceError, match="forbidden"):
        retry_until_ready(refuse, "the peer", get_logger(), timeout=60, interval=0.01)


def test_a_peer_that_never_answers_ends_the_wait_at_the_timeout():
    with pytest.raises(PeerUnavailable, match="the peer did not become ready within 0 s"):
        retry_until_ready(unreachable, "the peer", get_logger(), timeout=0.2, interval=0.05)


def test_a_stop_ends_the_wait_at_once_instead_of_at_the_timeout():
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    calls = []

    def refused():
        calls.append(1)
        unreachable()

    # an hour between attempts: only the stop can end the first wait (else pytest's timeout fails the test)
    with pytest.raises(StopRequested, match="the union index"):
        retry_until_ready(refused, "the union index", get_logger(), timeout=7200, interval=3600, stop=stop)
    assert len(calls) == 1
