"""What a worker knows about itself: role, rank, world size, devices, where it runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf.sched.placement import ComponentPlacement
from rlinf.workers.errors import ConfigError

__all__ = ["WorkerContext", "WorkerInfo", "rank_devices"]


@dataclass(frozen=True)
class WorkerContext:
    """Identity of one rank, handed to `Worker.__init__` by its `WorkerGroup`."""

    role: str
    """Component name, e.g. "rollout" or "actor" (the placement's component)."""
    rank: int
    """Index of this worker in its group, 0 <= rank < world_size."""
    world_size: int
    """Number of ranks in the group."""
    devices: tuple[int, ...] = ()
    """Logical devices of this rank from the placement (CPU slots when there is no GPU)."""
    group_name: str = ""
    """Unique name of the launching group (prefix of the Ray actor names)."""
    log_level: str | None = None
    """Configure structlog in this process at this level; None leaves logging alone (the
    group sets it, so a Worker built directly in a test does not reconfigure the driver)."""
    device_lock_address: str | None = None
    """``"host:port"`` of the run's `rlinf.sched.DeviceLockServer`, or ``"local:<name>"`` for
    the `rlinf.sched.LocalDeviceLock` its process's components share; None: no device
    lock."""
    device_lock_token: bytes | None = field(default=None, repr=False)
    """Shared secret of the lock server (kept out of reprs and logs)."""
    memory_bytes: int | None = None
    """Bytes per device this component needs when it holds its devices, as the plan priced
    it; the device lock keeps components that fit together co-resident. None: the worker's
    own `Worker.resident_memory_bytes` decides."""
    device_memory: int | None = None
    """Bytes of memory of each of this rank's devices, which an in-process device lock
    (``local:``) fits residents into; None: unknown (one component resident at a time)."""
    trace: bool = False
    """Record trace spans (the launch's ``trace`` option; `rlinf.workers.flow.FlowWorker`
    keeps them on track ``"{role}/{rank}"``)."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"rank must be in [0, world_size={self.world_size}), got {self.rank}"
            )
        if (self.device_lock_address is None) != (self.device_lock_token is None):
            raise ConfigError("device_lock_address and device_lock_token go together: "
                              "pass both or neither")
        if self.memory_bytes is not None and (isinstance(self.memory_bytes, bool)
                                              or self.memory_bytes < 0):
            raise ConfigError(f"memory_bytes={self.memory_bytes!r}: expected bytes >= 0 or None")


@dataclass(frozen=True)
class WorkerInfo:
    """Where a launched rank runs; the group records it to name ranks in errors."""

    rank: int
    """The rank this describes."""
    node_ip: str
    """IP address of the node (as Ray reports it)."""
    node_id: str
    """Ray node id (hex)."""
    pid: int
    """Process id of the worker."""


def rank_devices(placement: ComponentPlacement, rank: int) -> tuple[int, ...]:
    """The device of `rank` under `placement`: ranks fill each device's processes in turn.

    With devices (2, 5) and two processes per device, ranks 0, 1 get device 2 and ranks
    2, 3 device 5.
    """
    if not 0 <= rank < placement.num_procs:
        raise ConfigError(
            f"rank {rank} is outside placement {placement.to_spec()!r} "
            f"({placement.num_procs} ranks)"
        )
    return (placement.devices[rank // placement.procs_per_device],)
