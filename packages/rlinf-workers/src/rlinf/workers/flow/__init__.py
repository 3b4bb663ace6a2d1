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
- `WeightSender` / `WeightReceiver`: the trainer's and the generators' halves of weight
  sync, mixed into a component next to its base class.
- `FlowWorker`: the base of components (device turns, channels, the runtime's entry call);
  entry methods take ``(ctx: StepContext, *, input_channel=, output_channel=)`` where
  ``*_channel`` are `FlowChannel`s, or ``(ctx, *, inputs=, outputs=)`` mappings from the
  peer component to its `FlowChannel` (loops, several channels a side). Loops run inside an
  iteration (`StepContext.loop_steps`); `ComponentSpec.inline_with` lets a component run
  inside its host's process where the plan puts them on the same devices.

These are the names a workflow's author needs. The runtime's parts live in submodules:
`auto` (probes, the profile entries they record, the cluster's calibration), `trials`
(plans tried a few steps each, the fastest kept), `records` (an iteration's phases and the
profile they make), `restarts`, `peer` and `channels` (the transports), `weights`.
"""

from rlinf.workers.flow.auto import AutoReport, launch_auto, plan_flow, profile_flow
from rlinf.workers.flow.channels import FlowChannel, Sharding
from rlinf.workers.flow.context import StepContext
from rlinf.workers.flow.declaration import ChannelSpec, ComponentSpec, MacroFlow, WeightSyncSpec
from rlinf.workers.flow.errors import FlowClosedError, FlowDeclarationError
from rlinf.workers.flow.peer import PeerGoneError, PeerTimeoutError
from rlinf.workers.flow.records import IterationRecord
from rlinf.workers.flow.run import FlowRun
from rlinf.workers.flow.weight_roles import WeightReceiver, WeightSender
from rlinf.workers.flow.weights import WeightTransport
from rlinf.workers.flow.worker import FlowWorker
from rlinf.workers.runtime.ray_session import ensure_ray

__all__ = [
    "AutoReport",
    "ChannelSpec",
    "ComponentSpec",
    "FlowChannel",
    "FlowClosedError",
    "FlowDeclarationError",
    "FlowRun",
    "FlowWorker",
    "IterationRecord",
    "MacroFlow",
    "PeerGoneError",
    "PeerTimeoutError",
    "Sharding",
    "StepContext",
    "WeightReceiver",
    "WeightSender",
    "WeightSyncSpec",
    "WeightTransport",
    "ensure_ray",
    "launch_auto",
    "plan_flow",
    "profile_flow",
]
