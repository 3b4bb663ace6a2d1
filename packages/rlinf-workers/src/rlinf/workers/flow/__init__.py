"""The flow runtime: declare an RL workflow once; the library profiles, plans, launches and
runs it.

- `MacroFlow` (`ComponentSpec`, `ChannelSpec`, `WeightSyncSpec` with its `WeightTransport`,
  and `rlinf.sched`'s `Component`, `Edge`, `Loop`): the declaration;
  `to_sched_workflow()` is what the planner prices, `fixed_plan(spec)` an unpriced plan
  for a placement written by hand.
- `FlowRun.launch(flow, plan)`: worker groups on the plan's placement, a device lock where
  devices are shared, one channel per edge owned by its consumer, weight-sync paths;
  `step(k)` runs an iteration as named, timed phases (`IterationRecord`); `profile()`
  turns them into an `rlinf.sched.Profile`; `close()` tears everything down (also on
  errors and Ctrl-C).
- `launch_auto(flow, cluster, batch_sizes=...)`: profile, fit, plan, launch the best plan
  (`AutoReport` compares predicted and measured seconds per iteration).
- `shortlist` / `try_plans` / `fastest` / `format_trials`, together `run_trials`
  (`PlanTrial`): the plans priced within a margin of the best, each run a few steps, the
  fastest as measured kept.
- `WeightSender` / `WeightReceiver`: the trainer's and the generators' halves of weight
  sync, mixed into a component next to its base class.
- `FlowWorker`: the base of components (device turns, channels, the runtime's entry call);
  entry methods take ``(ctx: StepContext, *, input_channel=, output_channel=)`` where
  ``*_channel`` are `FlowChannel`s, or ``(ctx, *, inputs=, outputs=)`` mappings from the
  peer component to its `FlowChannel` (loops, several channels a side). Loops run inside an
  iteration (`StepContext.loop_steps`); `ComponentSpec.inline_with` lets a component run
  inside its host's process where the plan puts them on the same devices.
"""

from rlinf.workers.flow.auto import (
    COLLOCATED_ITERATION,
    COLLOCATED_PLANS,
    CONTROL,
    PROBE_ITERATION,
    PROBE_PLAN,
    PROFILE_FORMAT,
    WEIGHT_SYNC,
    AutoReport,
    ProbeRun,
    ProbeSimulation,
    calibrated_cluster,
    collocated_probes,
    fit_latency,
    fit_turn_latency,
    launch_auto,
    merge_run_profiles,
    overhead_seconds,
    pipeline_probe,
    pipeline_probe_spec,
    plan_flow,
    profile_device_counts,
    profile_flow,
    run_profile,
)
from rlinf.workers.flow.channels import ChannelTransport, FlowChannel, Sharding, rank_key
from rlinf.workers.flow.context import StepContext
from rlinf.workers.flow.declaration import ChannelSpec, ComponentSpec, MacroFlow, WeightSyncSpec
from rlinf.workers.flow.errors import (
    FlowClosedError,
    FlowCycleError,
    FlowDeclarationError,
    UnknownComponentError,
    WeightSyncTargetError,
)
from rlinf.workers.flow.peer import PeerChannel, PeerGoneError, PeerTimeoutError
from rlinf.workers.flow.records import IterationRecord, PhaseRecord, profile_of
from rlinf.workers.flow.restarts import with_restarts
from rlinf.workers.flow.run import FlowRun
from rlinf.workers.flow.trials import (
    PlanTrial,
    fastest,
    format_trials,
    run_trials,
    shortlist,
    try_plans,
)
from rlinf.workers.flow.weight_roles import BucketLayout, WeightReceiver, WeightSender
from rlinf.workers.flow.weights import TRANSPORTS, WeightSync, WeightTransport
from rlinf.workers.flow.worker import EntryReport, FlowWorker
from rlinf.workers.runtime.ray_session import (
    cluster_address,
    cluster_reachable,
    ensure_ray,
    local_ray_instance,
)

__all__ = [
    "COLLOCATED_ITERATION",
    "COLLOCATED_PLANS",
    "CONTROL",
    "PROBE_ITERATION",
    "PROBE_PLAN",
    "PROFILE_FORMAT",
    "TRANSPORTS",
    "WEIGHT_SYNC",
    "AutoReport",
    "BucketLayout",
    "ChannelSpec",
    "ChannelTransport",
    "ComponentSpec",
    "EntryReport",
    "FlowChannel",
    "FlowClosedError",
    "FlowCycleError",
    "FlowDeclarationError",
    "FlowRun",
    "FlowWorker",
    "IterationRecord",
    "MacroFlow",
    "PeerChannel",
    "PeerGoneError",
    "PeerTimeoutError",
    "PhaseRecord",
    "PlanTrial",
    "ProbeRun",
    "ProbeSimulation",
    "Sharding",
    "StepContext",
    "UnknownComponentError",
    "WeightReceiver",
    "WeightSender",
    "WeightSync",
    "WeightSyncSpec",
    "WeightSyncTargetError",
    "WeightTransport",
    "calibrated_cluster",
    "cluster_address",
    "cluster_reachable",
    "collocated_probes",
    "ensure_ray",
    "fastest",
    "fit_latency",
    "fit_turn_latency",
    "format_trials",
    "launch_auto",
    "local_ray_instance",
    "merge_run_profiles",
    "overhead_seconds",
    "pipeline_probe",
    "pipeline_probe_spec",
    "plan_flow",
    "profile_device_counts",
    "profile_flow",
    "profile_of",
    "rank_key",
    "run_profile",
    "run_trials",
    "shortlist",
    "try_plans",
    "with_restarts",
]
