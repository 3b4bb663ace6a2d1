"""rlinf.sched — where and when RL components run.

Cluster discovery, the placement syntax, the distributed per-device lock with context
switching, the profiler with fitted cost curves, and the M2Flow planner.
"""

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
    format_devices,
    parse_placement,
)
from rlinf.sched.version import __version__

__all__ = [
    "ClusterError",
    "ComponentPlacement",
    "CostModel",
    "DeviceLockError",
    "DeviceLockTimeoutError",
    "ExecutionMode",
    "HolderDiedError",
    "Placement",
    "PlacementError",
    "PlanningError",
    "ProfileError",
    "SchedError",
    "__version__",
    "format_devices",
    "parse_placement",
]
