"""rlinf.sched — where and when RL components run.

Cluster discovery, the placement syntax, the distributed per-device lock with context
switching, the profiler with fitted cost curves, and the M2Flow planner.
"""

from typing import TYPE_CHECKING, Any

from rlinf.sched.cluster import Cluster, Device, Node
from rlinf.sched.context_switch import CallbackOnloadable, ContextSwitcher, Onloadable, SwitchEvent
from rlinf.sched.costs import CostModel
from rlinf.sched.errors import (
    ClusterError,
    DeviceLockError,
    DeviceLockTimeoutError,
    HolderDiedError,
    PlacementError,
    PlanningError,
    ProfileError,
    SchedError,
)
from rlinf.sched.placement import (
    ComponentPlacement,
    ExecutionMode,
    Placement,
    derive_mode,
    format_devices,
    parse_placement,
)
from rlinf.sched.profiler import (
    CostCurve,
    FittedCostModel,
    Measurement,
    Profile,
    Profiler,
    fit_curve,
    fit_profile,
)
from rlinf.sched.version import __version__

if TYPE_CHECKING:
    from rlinf.sched.device_lock import (
        DeviceLockClient,
        DeviceLockServer,
        Eviction,
        Grant,
        HolderDeath,
    )

# The device lock pulls in rlinf.comm's wire layer (and pyarrow): import it on first use so
# that planning-only users (`rlinf-plan`) stay light.
_LAZY = {"DeviceLockClient", "DeviceLockServer", "Eviction", "Grant", "HolderDeath"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from rlinf.sched import device_lock

        return getattr(device_lock, name)
    raise AttributeError(f"module 'rlinf.sched' has no attribute {name!r}")

__all__ = [
    "CallbackOnloadable",
    "Cluster",
    "ClusterError",
    "ComponentPlacement",
    "ContextSwitcher",
    "CostCurve",
    "CostModel",
    "Device",
    "DeviceLockClient",
    "DeviceLockError",
    "DeviceLockServer",
    "DeviceLockTimeoutError",
    "Eviction",
    "ExecutionMode",
    "FittedCostModel",
    "Grant",
    "HolderDeath",
    "HolderDiedError",
    "Measurement",
    "Node",
    "Onloadable",
    "Placement",
    "PlacementError",
    "PlanningError",
    "Profile",
    "ProfileError",
    "Profiler",
    "SchedError",
    "SwitchEvent",
    "__version__",
    "derive_mode",
    "fit_curve",
    "fit_profile",
    "format_devices",
    "parse_placement",
]
