"""Logging setup for worker processes (libraries only call `structlog.get_logger`)."""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure_worker_logging"]

_configured_level: str | None = None


def configure_worker_logging(level: str = "INFO", *, role: str, rank: int) -> None:
    """Configure structlog once in this worker process and tag every event with role/rank.

    role and rank go into structlog's context variables, so events from any library logger
    in this process (rlinf.comm, rlinf.sched, ...) carry them, not only the worker's own.
    Events render as key=value lines on stderr, which Ray forwards to the driver.
    """
    global _configured_level  # noqa: PLW0603 (process-wide logging state is global by nature)
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        numeric = logging.INFO
    if _configured_level != level:
        structlog.configure(
            processors=[
                structlog.contextvars.merge_contextvars,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.format_exc_info,
                structlog.dev.ConsoleRenderer(colors=False),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
            cache_logger_on_first_use=False,
        )
        _configured_level = level
    structlog.contextvars.bind_contextvars(role=role, rank=rank)
