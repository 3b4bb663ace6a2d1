"""Typed errors of an app's command line: the usual mistakes behind a failed composition,
each said in one line that names what to write instead."""

from __future__ import annotations

from typing import Any

from rlinf.workers.errors import ConfigError

__all__ = ["NotAnOverrideError", "UnknownKeyError", "UnquotedValueError"]


class UnknownKeyError(ConfigError):
    """A command-line override names a key the config does not have."""

    def __init__(self, key: str, suggestions: tuple[str, ...], prog: str = "the app") -> None:
        self.key = key
        self.suggestions = suggestions
        self.prog = prog
        guess = f"; did you mean {' or '.join(map(repr, suggestions))}?" if suggestions else ""
        super().__init__(f"unknown config key {key!r}{guess} (`{prog} --help` lists every key "
                         "and config group)")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.suggestions, self.prog))


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


class NotAnOverrideError(ConfigError):
    """A command-line word is neither a flag nor ``key=value``."""

    def __init__(self, word: str, prog: str = "the app") -> None:
        self.word = word
        self.prog = prog
        super().__init__(f"{word!r} is not an override: expected key=value (see {prog} --help)")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.word, self.prog))
