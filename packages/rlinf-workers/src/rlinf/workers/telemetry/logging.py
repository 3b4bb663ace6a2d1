"""Process-wide logging setup: structlog events and stdlib records through one renderer.

Libraries only call ``structlog.get_logger(__name__)``; an app's entry point (and each
worker process, via `rlinf.workers.runtime.configure_worker_logging`) calls
`configure_logging` once. structlog events go through the stdlib logging machinery, so
records from third-party stdlib loggers (Ray, transformers, ...) render the same way: a
human-readable console line by default, one JSON object per line with ``json=True``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

from rlinf.workers.errors import ConfigError

__all__ = ["configure_logging", "parse_level"]

_LEVELS = ("debug", "info", "warning", "error", "critical")
_handler: logging.Handler | None = None


def parse_level(level: str | int) -> int:
    """The stdlib numeric level of ``"info"``/``"INFO"``/``20``; `ConfigError` otherwise."""
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    numeric = logging.getLevelNamesMapping().get(str(level).upper())
    if numeric is None:
        raise ConfigError(f"log level {level!r} is unknown; use one of {list(_LEVELS)}")
    return numeric


def configure_logging(
    *, level: str = "info", json: bool = False, stream: TextIO | None = None
) -> None:
    """Route structlog and stdlib logging to `stream` (default stderr) at `level`.

    Idempotent: calling it again replaces the previous setup (it never stacks handlers),
    so apps, tests and worker processes may each call it. Console output is coloured only
    when the stream is a terminal. Events below `level` are dropped before formatting.
    """
    global _handler  # noqa: PLW0603 (process-wide logging state is global by nature)
    numeric = parse_level(level)
    out = stream if stream is not None else sys.stderr
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,
        timestamper,
    ]
    renderer: Any
    if json:
        final: list[Any] = [structlog.processors.format_exc_info,
                            structlog.processors.JSONRenderer(default=str)]
    else:
        colors = bool(getattr(out, "isatty", lambda: False)())
        renderer = structlog.dev.ConsoleRenderer(colors=colors)
        final = [renderer]
    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(),
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    root.addHandler(handler)
    root.setLevel(numeric)
    _handler = handler
