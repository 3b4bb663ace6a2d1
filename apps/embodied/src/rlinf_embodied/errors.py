"""Typed errors of the embodied app.

They derive from `rlinf.workers.errors` (so a caller catching `ConfigError` or
`MissingExtraError` from the library also catches the app's) and survive pickling.
"""

from __future__ import annotations

from typing import Any

from rlinf.workers.cli.errors import UnknownKeyError, UnquotedValueError
from rlinf.workers.errors import InvalidConfigError, MissingExtraError
from rlinf.workers.training import CheckpointMismatchError

__all__ = [
    "AppConfigError",
    "AppMissingExtraError",
    "CheckpointMismatchError",
    "UnknownKeyError",
    "UnquotedValueError",
]


AppConfigError = InvalidConfigError
"""A config key has a wrong type, an out-of-range value or is not a known key (the
library's `rlinf.workers.errors.InvalidConfigError`, under the name this app's callers
know)."""


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
