"""Typed errors of the embodied app.

They derive from `rlinf.workers.errors` (so a caller catching `ConfigError` or
`MissingExtraError` from the library also catches the app's) and survive pickling.
"""

from __future__ import annotations

from typing import Any

from rlinf.workers.errors import ConfigError, MissingExtraError, WorkersError

__all__ = [
    "AppConfigError",
    "AppMissingExtraError",
    "CheckpointMismatchError",
    "UnknownKeyError",
    "UnquotedValueError",
]


class AppConfigError(ConfigError):
    """A config key has a wrong type, an out-of-range value or is not a known key."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"config key {key!r} = {value!r} is invalid: expected {allowed}")
        self.key = key
        self.value = value
        self.allowed = allowed

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.value, self.allowed))


class UnknownKeyError(ConfigError):
    """A command-line override names a key the config does not have."""

    def __init__(self, key: str, suggestions: tuple[str, ...]) -> None:
        guess = f"; did you mean {' or '.join(map(repr, suggestions))}?" if suggestions else ""
        super().__init__(f"unknown config key {key!r}{guess} (`rlinf-embodied --help` lists "
                         "every key and config group)")
        self.key = key
        self.suggestions = suggestions

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.suggestions))


class UnquotedValueError(ConfigError):
    """A value with spaces or commas reached Hydra unquoted: split into several arguments by
    the shell, or read by Hydra as a list of values."""

    def __init__(self, key: str, value: str) -> None:
        # Outer quotes keep one shell argument; inner ones make Hydra read one string.
        quoted = f"\"{key}='{value}'\"" if "'" not in value else f"'{key}=\"{value}\"'"
        super().__init__(f"the value of {key!r} has spaces or commas and must reach Hydra "
                         f"quoted, as one argument: write {quoted}")
        self.key = key
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.value))


class AppMissingExtraError(MissingExtraError):
    """The config needs an optional dependency of the app; the message names the app extra."""

    def __init__(self, feature: str, extra: str, module: str, install: str | None = None
                 ) -> None:
        self.install = install or f"pip install 'rlinf-embodied[{extra}]'"
        """The command that installs what is missing."""
        ImportError.__init__(
            self,
            f"{feature} needs the {module!r} module, which is not installed; install it with "
            f"`{self.install}`",
        )
        self.feature = feature
        self.extra = extra
        self.module = module

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.feature, self.extra, self.module, self.install))


class CheckpointMismatchError(WorkersError, ValueError):
    """`--resume` found a checkpoint written by a run of a different config."""

    def __init__(self, path: str, differences: tuple[str, ...]) -> None:
        super().__init__(
            f"checkpoint {path} was written by a different config ({'; '.join(differences)}); "
            "resume with the same config (only run.iterations may change) or use a new run_dir"
        )
        self.path = path
        self.differences = differences

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.differences))
