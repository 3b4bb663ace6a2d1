"""Typed errors of the reasoning app; all derive from `rlinf.workers.ConfigError` (a missing
engine also from `rlinf.workers.MissingExtraError`).

Each carries the offending config key (or override), the value given and what is allowed, so
the CLI can print one line that says what to change. They rebuild from those fields when
pickled.
"""

from __future__ import annotations

from typing import Any

from rlinf.workers.errors import ConfigError, MissingExtraError
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


class InvalidConfigError(ConfigError):
    """A config value is unknown, of the wrong type, out of range, or impossible here."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key = key
        self.value = value
        self.allowed = allowed
        super().__init__(f"config key {key!r} = {value!r} is invalid: expected {allowed}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.value, self.allowed))


class ExportError(ConfigError):
    """``export`` cannot write the model: no such checkpoint, or it does not fit the run's
    model."""


class UnknownKeyError(ConfigError):
    """A command-line override names a key the config does not have."""

    def __init__(self, key: str, suggestions: tuple[str, ...]) -> None:
        self.key = key
        self.suggestions = suggestions
        guess = f"; did you mean {' or '.join(map(repr, suggestions))}?" if suggestions else ""
        super().__init__(f"unknown config key {key!r}{guess} (`rlinf-reasoning --help` lists "
                         "every key)")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.suggestions))


class UnquotedValueError(ConfigError):
    """A value with spaces or commas reached Hydra unquoted: split into several arguments by
    the shell, or read by Hydra as a list of values."""

    def __init__(self, key: str, value: str) -> None:
        self.key = key
        self.value = value
        # Outer quotes keep one shell argument; inner ones make Hydra read one string.
        quoted = f"\"{key}='{value}'\"" if "'" not in value else f"'{key}=\"{value}\"'"
        sweep = " (or add -m to run one job per comma-separated value)" if "," in value else ""
        super().__init__(f"the value of {key!r} has spaces or commas and must reach Hydra "
                         f"quoted, as one argument: write {quoted}{sweep}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.value))


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
