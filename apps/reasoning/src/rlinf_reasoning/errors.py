"""Typed errors of the reasoning app; all derive from `rlinf.workers.ConfigError`.

Each carries the offending config key, the value given and what is allowed, so the CLI can
print one line that says what to change. They rebuild from those fields when pickled.
"""

from __future__ import annotations

from typing import Any

from rlinf.workers.errors import ConfigError

__all__ = ["CheckpointMismatchError", "InvalidConfigError", "ResumeError"]


class InvalidConfigError(ConfigError):
    """A config value is unknown, of the wrong type, out of range, or impossible here."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key = key
        self.value = value
        self.allowed = allowed
        super().__init__(f"config key {key!r} = {value!r} is invalid: expected {allowed}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.value, self.allowed))


class ResumeError(ConfigError):
    """``--resume`` cannot continue: no checkpoint, or the run directory is unusable."""


class CheckpointMismatchError(ResumeError):
    """The checkpoint was written by a run whose config differs in more than its length."""

    def __init__(self, checkpoint: str, differences: tuple[str, ...]) -> None:
        self.checkpoint = checkpoint
        self.differences = differences
        listed = "; ".join(differences)
        super().__init__(
            f"checkpoint {checkpoint} was written with a different config ({listed}): a run "
            "can only be resumed with the same config except run.steps; pass the original "
            "overrides again, or start a new run in another --run-dir"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.checkpoint, self.differences))
