"""Typed errors of the reasoning app; all derive from `rlinf.workers.ConfigError` (a missing
engine also from `rlinf.workers.MissingExtraError`).

Each carries the offending config key (or override), the value given and what is allowed, so
the CLI can print one line that says what to change. They rebuild from those fields when
pickled.
"""

from __future__ import annotations

from typing import Any

from rlinf.workers.cli.errors import UnknownKeyError, UnquotedValueError
from rlinf.workers.errors import ConfigError, InvalidConfigError, MissingExtraError
from rlinf.workers.training import CheckpointMismatchError, ResumeError

__all__ = [
    "CheckpointMismatchError",
    "DataFileError",
    "ExportError",
    "InvalidConfigError",
    "MissingEngineError",
    "ResumeError",
    "UnknownKeyError",
    "UnquotedValueError",
]


class ExportError(ConfigError):
    """``export`` cannot write the model: no such checkpoint, or it does not fit the run's
    model."""


class DataFileError(ConfigError):
    """A problem file (`data.path`, `data.heldout_path`) cannot be read as problems."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"{key}: {reason}; fix the file or point {key} at another one")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.reason))


class MissingEngineError(MissingExtraError):
    """`rollout.engine` names an engine whose package is not installed."""

    def __init__(self, engine: str, module: str, extra: str) -> None:
        # MissingExtraError's own message names no config key; this one says which to change.
        ImportError.__init__(
            self, f"rollout.engine={engine!r} needs the {module!r} module, which is not "
            f"installed: install it with `pip install 'rlinf-workers[{extra}]'`, or set "
            "rollout.engine=hf")
        self.engine = engine
        self.feature = f"rollout.engine={engine!r}"
        self.extra = extra
        self.module = module

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.engine, self.module, self.extra))
