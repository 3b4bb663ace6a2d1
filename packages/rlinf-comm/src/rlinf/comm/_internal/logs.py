"""rlinf.comm's loggers: structlog once the host configured it, quiet stdlib logging before.

A library must not print: structlog's default configuration writes every event, debug ones
included, to stdout, so a program that uses rlinf.comm and configures nothing saw its
stdout filled with ``connection_accepted``. Until the host calls `structlog.configure`, our
events go to the stdlib `logging` logger named after the module instead: nothing below
WARNING unless the host configures `logging`, and warnings and errors on stderr (Python's
last-resort handler). The check runs at each event, so a host that configures structlog
after importing rlinf.comm gets every later event through structlog.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

__all__ = ["Logger", "get_logger"]


class Logger:
    """The subset of a structlog logger that rlinf.comm uses: ``debug``, ``info``,
    ``warning``, ``error`` with an event name and key=value data."""

    __slots__ = ("_stdlib", "_structlog")

    def __init__(self, name: str) -> None:
        self._structlog = structlog.get_logger(name)  # a lazy proxy: reads no config yet
        self._stdlib = logging.getLogger(name)

    def _log(self, level: int, method: str, event: str, data: dict[str, Any]) -> None:
        if structlog.is_configured():
            # By method name: every wrapper class has these, not all take a level number.
            getattr(self._structlog, method)(event, **data)
        elif self._stdlib.isEnabledFor(level):
            fields = " ".join(f"{key}={value!r}" for key, value in data.items())
            self._stdlib.log(level, "%s %s", event, fields)

    def debug(self, event: str, **data: Any) -> None:
        self._log(logging.DEBUG, "debug", event, data)

    def info(self, event: str, **data: Any) -> None:
        self._log(logging.INFO, "info", event, data)

    def warning(self, event: str, **data: Any) -> None:
        self._log(logging.WARNING, "warning", event, data)

    def error(self, event: str, **data: Any) -> None:
        self._log(logging.ERROR, "error", event, data)


def get_logger(name: str) -> Logger:
    """The logger of module `name` (use ``get_logger(__name__)``)."""
    return Logger(name)
