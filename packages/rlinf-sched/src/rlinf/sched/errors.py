"""Typed errors of rlinf.sched: one root, subclasses that also inherit the matching builtin."""

from __future__ import annotations


class SchedError(Exception):
    """Root of every error raised by rlinf.sched."""


class PlacementError(SchedError, ValueError):
    """A placement spec is malformed or impossible on the given cluster."""


class ClusterError(SchedError, RuntimeError):
    """The cluster could not be discovered, or a cluster file is invalid."""


class DeviceLockError(SchedError, RuntimeError):
    """A device-lock operation failed (not the holder, server gone, protocol misuse)."""


class DeviceLockTimeoutError(DeviceLockError, TimeoutError):
    """The device lock was not granted within the timeout."""


class HolderDiedError(DeviceLockError):
    """The process holding (or queued for) a device lock died; the message names it."""


class ProfileError(SchedError, ValueError):
    """A profile is missing, malformed, or cannot be fitted."""


class PlanningError(SchedError, ValueError):
    """No feasible execution plan exists for the workflow on the cluster."""
