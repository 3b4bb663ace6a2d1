"""rlinf.sched — where and when RL components run.

Cluster discovery, the placement syntax, the distributed per-device lock with context
switching, the profiler with fitted cost curves, and the M2Flow planner.
"""

from typing import TYPE_CHECKING, Any

from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel, load_cost_model
from rlinf.sched.cluster import Cluster, Device, Node
from rlinf.sched.context_switch import CallbackOnloadable, ContextSwitcher, Onloadable, SwitchEvent
from rlinf.sched.core_sharing import CoreSharing
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
from rlinf.sched.execution_plan import ExecutionPlan, PlanResult
from rlinf.sched.granularity import check_micro_batches
from rlinf.sched.model_parallel import (
    CutPricedCosts,
    ParallelCut,
    TrainerCost,
    annotate_cuts,
    format_cut,
)
from rlinf.sched.placement import (
    ComponentPlacement,
    ExecutionMode,
    Placement,
    derive_mode,
    format_devices,
    parse_placement,
)
from rlinf.sched.planner import (
    PlannerOptions,
    PlanProgress,
    ProgressCallback,
    exhaustive_search,
    plan,
)
from rlinf.sched.processes import process_of, process_sets
from rlinf.sched.profile_cache import ProfileCache, profile_key
from rlinf.sched.profiler import (
    CostCurve,
    FittedCostModel,
    Measurement,
    Profile,
    Profiler,
    fit_curve,
    fit_profile,
)
from rlinf.sched.replan import (
    Call,
    DriftPolicy,
    LiveCostModel,
    Replan,
    Replanner,
    switch_pays,
)
from rlinf.sched.residency import Admission, Residency
from rlinf.sched.simulator import Interval, SimulationResult, simulate
from rlinf.sched.streamed_costs import StreamedCosts
from rlinf.sched.version import __version__
from rlinf.sched.workflow import (
    Component,
    Edge,
    Loop,
    Workflow,
    WorkflowError,
    staircase_completion,
)

if TYPE_CHECKING:
    from rlinf.sched.device_lock import (
        DeviceLockClient,
        DeviceLockServer,
        Eviction,
        Grant,
        HolderDeath,
    )
    from rlinf.sched.local_lock import LocalDeviceLock, LocalLockClient

# The device lock pulls in rlinf.comm's wire layer (and pyarrow): import it on first use so
# that planning-only users (`rlinf-plan`) stay light.
_LAZY = {"DeviceLockClient", "DeviceLockServer", "Eviction", "Grant", "HolderDeath"}
_LAZY_LOCAL = {"LocalDeviceLock", "LocalLockClient"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from rlinf.sched import device_lock

        return getattr(device_lock, name)
    if name in _LAZY_LOCAL:
        from rlinf.sched import local_lock

        return getattr(local_lock, name)
    raise AttributeError(f"module 'rlinf.sched' has no attribute {name!r}")

__all__ = [
    "Admission",
    "AnalyticCost",
    "AnalyticCostModel",
    "Call",
    "CallbackOnloadable",
    "Cluster",
    "ClusterError",
    "Component",
    "ComponentPlacement",
    "ContextSwitcher",
    "CoreSharing",
    "CostCurve",
    "CostModel",
    "CutPricedCosts",
    "Device",
    "DeviceLockClient",
    "DeviceLockError",
    "DeviceLockServer",
    "DeviceLockTimeoutError",
    "DriftPolicy",
    "Edge",
    "Eviction",
    "ExecutionMode",
    "ExecutionPlan",
    "FittedCostModel",
    "Grant",
    "HolderDeath",
    "HolderDiedError",
    "Interval",
    "LiveCostModel",
    "LocalDeviceLock",
    "LocalLockClient",
    "Loop",
    "Measurement",
    "Node",
    "Onloadable",
    "ParallelCut",
    "Placement",
    "PlacementError",
    "PlanProgress",
    "PlanResult",
    "PlannerOptions",
    "PlanningError",
    "Profile",
    "ProfileCache",
    "ProfileError",
    "Profiler",
    "ProgressCallback",
    "Replan",
    "Replanner",
    "Residency",
    "SchedError",
    "SimulationResult",
    "StreamedCosts",
    "SwitchEvent",
    "TrainerCost",
    "Workflow",
    "WorkflowError",
    "__version__",
    "annotate_cuts",
    "check_micro_batches",
    "derive_mode",
    "exhaustive_search",
    "fit_curve",
    "fit_profile",
    "format_cut",
    "format_devices",
    "load_cost_model",
    "parse_placement",
    "plan",
    "process_of",
    "process_sets",
    "profile_key",
    "simulate",
    "staircase_completion",
    "switch_pays",
]
