"""Errors of the flow runtime (`rlinf.workers.flow`).

A declaration is checked when it is built, so a bad one fails before anything launches, with
a typed error that names the problem; every class also derives from `ConfigError` (and so
from `ValueError`). Errors of a running flow are the runtime's own (`WorkerDiedError`,
`WorkerCallError`, `WorkerTimeoutError`) plus `FlowClosedError`.
"""

from __future__ import annotations

from rlinf.workers.errors import ConfigError, WorkersError

__all__ = [
    "FlowClosedError",
    "FlowCycleError",
    "FlowDeclarationError",
    "UnknownComponentError",
    "WeightSyncTargetError",
]


class FlowDeclarationError(ConfigError):
    """A workflow declaration (or a plan for it) is invalid; the message says what and how
    to fix it."""


class UnknownComponentError(FlowDeclarationError):
    """A channel, loop, weight-sync edge or placement names a component the flow does not
    declare."""


class FlowCycleError(FlowDeclarationError):
    """Channels form a cycle that is not a declared loop with a feedback edge."""


class WeightSyncTargetError(FlowDeclarationError):
    """A weight-sync edge has no target, targets an undeclared component, or connects
    workers that do not implement the sender/receiver methods."""


class FlowClosedError(WorkersError, RuntimeError):
    """A `FlowRun` was used after `close()` (or after a failure closed it)."""
