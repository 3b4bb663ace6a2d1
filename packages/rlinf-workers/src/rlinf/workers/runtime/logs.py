"""Logging setup for worker processes (libraries only call `structlog.get_logger`)."""

from __future__ import annotations

import structlog

from rlinf.workers.telemetry.logging import configure_logging

__all__ = ["configure_worker_logging"]


def configure_worker_logging(
    level: str = "INFO", *, role: str, rank: int, json: bool = False
) -> None:
    """Configure logging once in this worker process and tag every event with role/rank.

    The same setup as an app's `configure_logging` (structlog + stdlib records, rendered on
    stderr, which Ray forwards to the driver); role and rank go into structlog's context
    variables, so events from any library logger in this process (rlinf.comm, rlinf.sched,
    ...) carry them, not only the worker's own.
    """
    configure_logging(level=level, json=json)
    structlog.contextvars.bind_contextvars(role=role, rank=rank)
