"""Typed errors of a training run's folder: it cannot start or resume as asked."""

from __future__ import annotations

from typing import Any

from rlinf.workers.errors import ConfigError

__all__ = ["CheckpointMismatchError", "ResumeError"]


class ResumeError(ConfigError):
    """The run folder cannot be used as asked: it holds a run and ``--resume`` was not
    given, ``--resume`` found no checkpoint, or the checkpoint is unreadable or finished."""


class CheckpointMismatchError(ResumeError):
    """The checkpoint was written by a run whose config differs in more than the keys a
    resumed run may change (its length, its folder, its loggers)."""

    def __init__(self, checkpoint: str, differences: tuple[str, ...],
                 may_change: tuple[str, ...] = ()) -> None:
        self.checkpoint = checkpoint
        self.differences = differences
        self.may_change = may_change
        listed = "; ".join(differences)
        allowed = f" except {', '.join(may_change)}" if may_change else ""
        super().__init__(
            f"checkpoint {checkpoint} was written with a different config ({listed}): a run "
            f"resumes only with the same config{allowed}; pass the original overrides "
            "again, or start a new run in another --run-dir")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.checkpoint, self.differences, self.may_change))
