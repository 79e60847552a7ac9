"""Structured logging (structlog) configured once by the entry point, never at import time."""

from __future__ import annotations

import logging
import sys
import threading

import structlog


def configure_logging(level: str = "warning", json: bool = False) -> None:
    """Route structlog to stderr as JSON (services) or as aligned key=value lines (CLI)."""
    numeric = logging.getLevelName(level.upper())
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,  # tracebacks as text, also in JSON logs
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_StderrLoggerFactory(),
        cache_logger_on_first_use=False,
    )


class _StderrLogger:
    """Writes each rendered line to the *current* ``sys.stderr``, whole.

    structlog's ``PrintLogger`` keeps the stream it was given; once a caller (a test runner, an
    embedding application) swaps ``sys.stderr`` and closes the old one, every later log line — even
    from long-lived loggers bound before the swap — would fail with "I/O operation on closed file".
    The line and its newline go out in one locked write: ``print`` writes them separately, and a
    service's threads then interleave records ("{a}{b}" on one line), which breaks every JSON-lines reader.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock

    def msg(self, message: str) -> None:
        with self._lock:
            sys.stderr.write(message + "\n")
            sys.stderr.flush()

    log = debug = info = warn = warning = error = err = critical = exception = fatal = failure = msg


class _StderrLoggerFactory:
    """One lock shared by every logger that ``configure_logging`` hands out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, *_args: object) -> _StderrLogger:
        return _StderrLogger(self._lock)


def get_logger(**context: object) -> structlog.typing.FilteringBoundLogger:
    """A logger with ``context`` bound (dataset, method, seed, client, round...)."""
    return structlog.get_logger().bind(**context)
