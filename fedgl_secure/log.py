"""Structured logging (structlog) configured once by the entry point, never at import time."""

from __future__ import annotations

import logging
import sys

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
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(**context: object) -> structlog.typing.FilteringBoundLogger:
    """A logger with ``context`` bound (dataset, method, seed, client, round...)."""
    return structlog.get_logger().bind(**context)
