"""`MacroFlow`: an RL workflow declared once — components, channels, loops, weight sync.

A user declares *what* runs; the runtime (`FlowRun`, `launch_auto`) decides nothing the
declaration already says and everything it does not (placement, granularity)::

    flow = MacroFlow(
        components=(
            ComponentSpec(Component("rollout", batch=8, micro_batch_multiple=2), RolloutRole,
                          entry="rollout_step", init_kwargs={"setup": setup, ...}),
            ComponentSpec(Component("reward", resource="cpu", batch=8, micro_batch_multiple=2),
                          RewardRole, entry="reward_step", init_kwargs={...}),
            ComponentSpec(Component("actor", batch=8, micro_batch_multiple=2), ActorRole,
                          entry="train_step", init_kwargs={...}, setup="build",
                          distributed=True),
        ),
        channels=(ChannelSpec(Edge("rollout", "reward")), ChannelSpec(Edge("reward", "actor"))),
        weight_syncs=(WeightSyncSpec("actor", ("rollout",)),),
        global_batch=8)

Each component nests the planner's own `rlinf.sched.Component` (name, resource kind,
batch per iteration, streaming, device limits) and each channel its `rlinf.sched.Edge`, so
`to_sched_workflow()` is the workflow the planner prices, with nothing restated (the unit a
channel's messages keep whole is its consumer's ``micro_batch_multiple``). The runtime adds
what only it needs: the worker class and its constructor arguments, the entry method it
calls each iteration, a setup method, whether the ranks form a torch.distributed group, and
per channel the message size of fixed plans.

Loops (env ↔ policy) run inside one iteration: the runtime creates a channel for each of the
loop's edges (the ``feedback`` edge included) and tells every member how many steps its loop
runs (`StepContext.loop_steps`); the members exchange over those channels until done. A
component with several inputs or outputs takes them as ``inputs=`` / ``outputs=`` mappings
keyed by the peer component. Components the plan puts on the same devices with as many
processes share one worker process per rank (`process_sets`; a component can insist on
its own: `isolated`), where they take turns and hand messages over in-process. A component
may further declare `ComponentSpec.inline_with` a host: where the plan puts both on the
same devices, the host itself does its work (no channel, no device-lock turns between
them) — the collocated env + policy of embodied RL.

``policy_lag=1`` declares a trainer one iteration behind its generators (off-policy by one
update): its input edges become lagged edges for the planner, and `FlowRun` overlaps its
update with the next rollout.

Every problem is found when the declaration is built and raised as a typed error naming it
(`UnknownComponentError`, `FlowCycleError`, `WeightSyncTargetError`, or their base
`FlowDeclarationError`).
"""

from __future__ import annotations

import dataclasses
import graphlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rlinf.sched import (
    Component,
    Edge,
    ExecutionPlan,
    Loop,
    Placement,
    PlacementError,
    Workflow,
    WorkflowError,
    parse_placement,
    process_sets,
)
from rlinf.workers.flow.channels import ChannelTransport
from rlinf.workers.flow.errors import (
    FlowCycleError,
    FlowDeclarationError,
    UnknownComponentError,
    WeightSyncTargetError,
)
from rlinf.workers.flow.weights import (
    RECEIVER_METHODS,
    SENDER_METHODS,
    TRANSPORTS,
    WeightTransport,
)
from rlinf.workers.flow.worker import FlowWorker, entry_parameters
from rlinf.workers.runtime.allocator import DEFAULT_ALLOCATOR, HostAllocator

__all__ = ["ChannelSpec", "ComponentSpec", "MacroFlow", "WeightSyncSpec"]


@dataclass(frozen=True)
class ComponentSpec:
    """One component: what the planner prices (`component`) and what the runtime launches."""

    component: Component
    """Name, resource kind (``"gpu"``/``"cpu"``), batch per iteration, streaming, device
    limits — the planner's `rlinf.sched.Component`."""
    worker: type[FlowWorker]
    """The worker class each rank runs (a `FlowWorker`, so a Ray actor)."""
    entry: str
    """Method the runtime calls once per iteration on every rank, as
    ``entry(ctx, input_channel=..., output_channel=...)`` (channels where the flow has them),
    or, when the method has ``inputs`` / ``outputs`` parameters, with mappings from the
    peer component's name to each `FlowChannel` (needed for several channels a side)."""
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the worker's constructor (after its `WorkerContext`)."""
    setup: str | None = None
    """Method called once on every rank after launch (after the process group), e.g.
    ``"build"`` for a trainer that wraps its model for data parallelism."""
    distributed: bool = False
    """Join the ranks into one torch.distributed process group (gloo on CPU, NCCL on GPU)
    when the plan gives the component more than one rank."""
    num_gpus: float | None = None
    """Ray GPUs each rank reserves, overriding the runtime's share (None): for flows whose
    placement devices are CPU slots while some processes compute on one shared GPU (a host
    takes the largest of its own and its inlined components')."""
    one_process: bool = False
    """One rank spanning every device the plan gives the component (its context lists them
    all), instead of one rank per device: a trainer that is not data-parallel and computes
    with one thread per CPU slot."""
    inline_with: str | None = None
    """A host component this one can run inside: when the plan places both on the same
    devices with one rank each, no process is launched for this one; the host's worker is
    constructed with `inline_kwargs` added and does this component's work in-process (its
    entry is not called, channels between the two are not created, weight syncs to it go to
    the host, and the host reports its busy time under this component's name:
    ``FlowWorker.turn(..., component=name)``). Every channel of an inlinable component
    connects it to its host."""
    inline_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Constructor arguments the host receives when it serves this component inline."""

    @property
    def name(self) -> str:
        """The component's name (its `rlinf.sched.Component`'s)."""
        return self.component.name


@dataclass(frozen=True)
class ChannelSpec:
    """The channel of one edge, created and owned by the consuming component's group."""

    edge: Edge
    """``src -> dst``, bytes per item, feedback — the planner's `rlinf.sched.Edge`. A message
    carries whole units of the consumer's ``micro_batch_multiple`` items (a group of
    ``group_size`` responses), the unit the planner also keeps whole."""
    granularity: int | None = None
    """Items per message in fixed plans (`MacroFlow.fixed_plan`), a multiple of the unit;
    None: the consumer's whole batch in one message."""
    transport: ChannelTransport = "channel"
    """``"channel"`` (an `rlinf.comm.Channel` owned by the consumer) or ``"p2p"`` (endpoint
    messages between single-rank ends, no owner round trips: env ↔ policy loops)."""

    @property
    def key(self) -> str:
        """``"src->dst"``."""
        return self.edge.key


@dataclass(frozen=True)
class WeightSyncSpec:
    """Weights flowing from a trainer to the components that generate with them."""

    src: str
    """The trainer (its worker implements the sender methods, e.g.
    `rlinf.workers.flow.WeightSender`)."""
    dst: tuple[str, ...]
    """The receivers (`rlinf.workers.flow.WeightReceiver`), loaded in this order:
    put the one that runs first in the next iteration last, so that when it shares the
    trainer's devices it keeps them."""
    transport: WeightTransport = "auto"
    """``"auto"``: derived from where the ranks run (`rlinf.workers.weight_sync.
    choose_transport`); or forced: ``"shm"`` (one node), ``"cuda_ipc"`` (the trainer's
    devices), ``"nccl"`` / ``"gloo"`` (a broadcast group; ``nccl`` on CPU means ``gloo``)."""


@dataclass(frozen=True)
class MacroFlow:
    """A whole workflow (see the module docstring)."""

    components: tuple[ComponentSpec, ...]
    """Every component, in the order the runtime starts their entry calls."""
    channels: tuple[ChannelSpec, ...] = ()
    """The data edges; each becomes one `rlinf.comm` channel."""
    weight_syncs: tuple[WeightSyncSpec, ...] = ()
    """Trainer → generator weight edges, synced after every iteration."""
    loops: tuple[Loop, ...] = ()
    """Components that exchange ``steps`` times per iteration (env ↔ policy) over the loop's
    channels; every member learns the count from `StepContext.loop_steps`."""
    global_batch: int | None = None
    """Items per iteration (the planner's unit); None: the largest component batch."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where ``gpu`` components compute: on ``cuda`` their ranks reserve GPUs and weights
    move by CUDA IPC or NCCL; on ``cpu`` every device is a CPU slot."""
    name: str = ""
    """Shown in plans and profiles."""
    policy_lag: int = 0
    """0: synchronous iterations. 1: the trainers (senders of weight syncs) run one
    iteration behind the other components (`FlowRun`): they train on the previous
    iteration's data beside the next rollout, which acts with weights one update old; the
    planner prices their input edges as lagged (ready when the iteration starts)."""
    host_allocator: HostAllocator = DEFAULT_ALLOCATOR
    """The ``malloc`` of every worker process (default: jemalloc keeping the pages it frees,
    so iterations reuse their host memory instead of faulting it in again;
    `rlinf.workers.runtime.allocator`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", tuple(self.components))
        object.__setattr__(self, "channels", tuple(self.channels))
        object.__setattr__(self, "weight_syncs", tuple(self.weight_syncs))
        object.__setattr__(self, "loops", tuple(self.loops))
        if self.device not in ("cpu", "cuda"):
            raise FlowDeclarationError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        self._check_components()
        self._check_channels()
        self._check_inline()
        self._check_weight_syncs()
        self._check_policy_lag()
        try:
            self.to_sched_workflow()
        except WorkflowError as exc:
            raise FlowDeclarationError(f"flow {self.name or '(unnamed)'}: {exc}") from exc
        self._check_entries()

    # -- checks ----------------------------------------------------------------------------

    @property
    def trainers(self) -> tuple[str, ...]:
        """The senders of weight syncs, in declaration order."""
        return tuple(dict.fromkeys(sync.src for sync in self.weight_syncs))

    def _check_policy_lag(self) -> None:
        """A lag of 1 needs trainers that feed nothing of the iteration they lag."""
        declared = sorted(c.key for c in self.channels if c.edge.lagged)
        if declared:
            raise FlowDeclarationError(
                f"channels {declared} are declared lagged: declare the flow's policy_lag=1 "
                "instead (its trainers' inputs are then lagged for the planner)")
        if self.policy_lag not in (0, 1):
            raise FlowDeclarationError(f"policy_lag must be 0 (synchronous) or 1 (the trainers "
                                       f"one iteration behind), got {self.policy_lag!r}")
        if not self.policy_lag:
            return
        if not self.trainers:
            raise FlowDeclarationError(
                "policy_lag=1 runs the trainers one iteration behind, but the flow declares no "
                "weight sync, so it has no trainer: declare a WeightSyncSpec or use policy_lag=0")
        feeding = sorted(c.key for c in self.channels if c.edge.src in self.trainers)
        if feeding:
            raise FlowDeclarationError(
                f"policy_lag=1 needs trainers whose only output is their weights, but {feeding} "
                "carry a trainer's data to components of the iteration it lags: use "
                "policy_lag=0")

    def _check_components(self) -> None:
        if not self.components:
            raise FlowDeclarationError("a flow needs at least one ComponentSpec")
        names = [c.name for c in self.components]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise FlowDeclarationError(f"components {repeated} are declared more than once: "
                                       "give every ComponentSpec its own name")
        for spec in self.components:
            if spec.num_gpus is not None and not spec.num_gpus >= 0:
                raise FlowDeclarationError(f"component {spec.name!r}: num_gpus must be >= 0 "
                                           f"(a share of a GPU per rank), got {spec.num_gpus}")
            if not (isinstance(spec.worker, type) and issubclass(spec.worker, FlowWorker)):
                raise FlowDeclarationError(
                    f"component {spec.name!r}: worker {spec.worker!r} is not a subclass of "
                    "rlinf.workers.flow.FlowWorker")
            for label, method in (("entry", spec.entry), ("setup", spec.setup)):
                if method is not None and (method.startswith("_") or not callable(
                        getattr(spec.worker, method, None))):
                    raise FlowDeclarationError(
                        f"component {spec.name!r}: {label} method {method!r} is not a public "
                        f"method of {spec.worker.__name__}")

    def _check_channels(self) -> None:
        known = self.names
        seen: set[str] = set()
        for channel in self.channels:
            for end in (channel.edge.src, channel.edge.dst):
                if end not in known:
                    raise UnknownComponentError(
                        f"channel {channel.key} names unknown component {end!r}: declare a "
                        f"ComponentSpec for it or use one of {list(known)}")
            if channel.transport not in ("channel", "p2p"):
                raise FlowDeclarationError(f"channel {channel.key}: transport must be "
                                           f"'channel' or 'p2p', got {channel.transport!r}")
            if channel.key in seen:
                raise FlowDeclarationError(f"channel {channel.key} is declared twice")
            seen.add(channel.key)
            unit = self.unit_of(channel)
            if channel.granularity is not None and (channel.granularity < 1
                                                    or channel.granularity % unit):
                raise FlowDeclarationError(
                    f"channel {channel.key}: granularity={channel.granularity} must be a "
                    f"positive multiple of {channel.edge.dst!r}'s micro_batch_multiple={unit}")
        for i, loop in enumerate(self.loops):
            unknown = [c for c in loop.components if c not in known]
            if unknown:
                raise UnknownComponentError(f"loop {i} names unknown component(s) {unknown}: "
                                            f"expected names among {list(known)}")
        graph = graphlib.TopologicalSorter({name: set() for name in known})
        for channel in self.channels:
            if not channel.edge.feedback:
                graph.add(channel.edge.dst, channel.edge.src)
        try:
            graph.prepare()
        except graphlib.CycleError as exc:
            cycle = " -> ".join(exc.args[1])
            raise FlowCycleError(
                f"channels form the cycle {cycle}: a cycle must be a loop — declare "
                "Loop((members...), steps=N) and mark the edge that feeds the next step "
                "Edge(..., feedback=True)") from exc

    def _check_entries(self) -> None:
        for spec in self.components:
            takes = entry_parameters(spec.worker, spec.entry)
            for side, channels, plural, single in (
                    ("input", self.inputs(spec.name), "inputs", "input_channel"),
                    ("output", self.outputs(spec.name), "outputs", "output_channel")):
                if channels and plural not in takes and single not in takes:
                    raise FlowDeclarationError(
                        f"component {spec.name!r}: entry {spec.worker.__name__}.{spec.entry} "
                        f"takes neither {plural}= nor {single}=, but the flow gives it "
                        f"{side} channel(s) {[c.key for c in channels]}")
                if len(channels) > 1 and plural not in takes:
                    raise FlowDeclarationError(
                        f"component {spec.name!r} has {len(channels)} {side} channels "
                        f"{[c.key for c in channels]}: its entry {spec.worker.__name__}."
                        f"{spec.entry} must take {plural}= (a mapping peer name -> "
                        f"FlowChannel), not {single}=")

    def _check_inline(self) -> None:
        known = self.names
        for spec in self.components:
            host = spec.inline_with
            if host is None:
                continue
            if host not in known or host == spec.name:
                raise UnknownComponentError(
                    f"component {spec.name!r}: inline_with={host!r} must name another "
                    f"component, one of {[n for n in known if n != spec.name]}")
            if self.component(host).inline_with is not None:
                raise FlowDeclarationError(
                    f"component {spec.name!r} inlines into {host!r}, which itself inlines into "
                    f"{self.component(host).inline_with!r}: inline into the outermost host")
            strangers = [c.key for c in (*self.inputs(spec.name), *self.outputs(spec.name))
                         if host not in (c.edge.src, c.edge.dst)]
            if strangers:
                raise FlowDeclarationError(
                    f"component {spec.name!r} can run inside {host!r}, but channels "
                    f"{strangers} connect it to others: an inlinable component talks only to "
                    "its host")

    def _check_weight_syncs(self) -> None:
        known = self.names
        for sync in self.weight_syncs:
            if sync.src not in known:
                raise UnknownComponentError(f"weight sync from unknown component {sync.src!r}: "
                                            f"expected one of {list(known)}")
            if sync.transport not in TRANSPORTS:
                raise WeightSyncTargetError(
                    f"weight sync {sync.src!r}: transport must be one of {list(TRANSPORTS)}, "
                    f"got {sync.transport!r}")
            if sync.transport == "cuda_ipc" and self.device != "cuda":
                raise WeightSyncTargetError(f"weight sync {sync.src!r}: transport 'cuda_ipc' "
                                            "needs device='cuda'; use 'auto'")
            if not sync.dst:
                raise WeightSyncTargetError(f"weight sync from {sync.src!r} has no target: "
                                            "name the components that generate with its weights")
            missing = [d for d in sync.dst if d not in known]
            if missing:
                raise WeightSyncTargetError(
                    f"weight sync {sync.src!r} -> {list(sync.dst)} targets undeclared "
                    f"component(s) {missing}: expected names among {list(known)}")
            for name, methods, side in ((sync.src, SENDER_METHODS, "sender"),
                                        *((d, RECEIVER_METHODS, "receiver") for d in sync.dst)):
                worker = self.component(name).worker
                lacking = [m for m in methods if not callable(getattr(worker, m, None))]
                if lacking:
                    raise WeightSyncTargetError(
                        f"weight sync {sync.src!r} -> {list(sync.dst)}: {name!r} "
                        f"({worker.__name__}) is the {side} but lacks {lacking}; derive it "
                        f"from rlinf.workers.flow.Weight{side.title()}")

    # -- queries ---------------------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        """Component names in declaration order."""
        return tuple(c.name for c in self.components)

    def component(self, name: str) -> ComponentSpec:
        """The component called `name`."""
        for spec in self.components:
            if spec.name == name:
                return spec
        raise UnknownComponentError(f"unknown component {name!r}: expected one of "
                                    f"{list(self.names)}")

    def unit_of(self, channel: ChannelSpec) -> int:
        """Items per unit on `channel`: its consumer's ``micro_batch_multiple``."""
        return self.component(channel.edge.dst).component.micro_batch_multiple

    def inputs(self, name: str) -> tuple[ChannelSpec, ...]:
        """Channels into `name` (feedback edges included)."""
        return tuple(c for c in self.channels if c.edge.dst == name)

    def outputs(self, name: str) -> tuple[ChannelSpec, ...]:
        """Channels out of `name`."""
        return tuple(c for c in self.channels if c.edge.src == name)

    @property
    def loop_steps(self) -> dict[str, int]:
        """Steps per iteration of the loop each looping component belongs to."""
        return {name: loop.steps for loop in self.loops for name in loop.components}

    @property
    def isolated(self) -> frozenset[str]:
        """Components that run in worker processes of their own under any placement: those
        whose `rlinf.sched.Component.isolated` says so and every distributed component after
        the first (a process has one torch.distributed default group). `isolated_under` adds
        what a placement decides."""
        distributed = [spec.name for spec in self.components if spec.distributed]
        return frozenset(spec.name for spec in self.components
                         if spec.component.isolated or spec.name in distributed[1:])

    def isolated_under(self, placement: Placement) -> frozenset[str]:
        """`isolated`, plus under `placement` the components that span several devices with
        one process (`ComponentSpec.one_process`: its process is not any device's) and the
        ends of a p2p edge between two processes (a rank's endpoint is named after its
        component; an edge to a component inlined into its peer sends nothing). Any other
        components placed on the same devices with as many processes share one process per
        rank (`process_sets`)."""
        inlined = set(self.inlined(placement))
        p2p = {end for c in self.channels if c.transport == "p2p"
               and not {c.edge.src, c.edge.dst} & inlined for end in (c.edge.src, c.edge.dst)}
        spanning = {spec.name for spec in self.components if spec.one_process
                    and len(placement.devices_of(spec.name)) > 1}
        return self.isolated | p2p | spanning

    def process_sets(self, placement: Placement) -> tuple[tuple[str, ...], ...]:
        """The launched components each set of worker processes serves under `placement`
        (`rlinf.sched.process_sets` with `isolated_under`; a component inlined into its host
        is served by the host and not listed)."""
        inlined = self.inlined(placement)
        sets = process_sets(placement, isolated=self.isolated_under(placement))
        return tuple(members for members in (tuple(n for n in s if n not in inlined)
                                             for s in sets) if members)

    def inlined(self, placement: Placement) -> dict[str, str]:
        """``{component: host}`` for every component `placement` lets run inside its host:
        both on the same devices with as many processes (each host rank serves the guest's
        rank of the same number)."""
        out: dict[str, str] = {}
        for spec in self.components:
            host = spec.inline_with
            if host is None or spec.name not in placement.components:
                continue
            ours, theirs = placement.components[spec.name], placement.components.get(host)
            if (theirs is not None and ours.devices == theirs.devices
                    and ours.num_procs == theirs.num_procs):
                out[spec.name] = host
        return out

    @property
    def batch(self) -> int:
        """Items per iteration: `global_batch`, or the largest component batch."""
        if self.global_batch is not None:
            return self.global_batch
        return max((c.component.batch or 1) for c in self.components)

    def items(self, global_batch: int | None = None) -> dict[str, int]:
        """Items each component processes in an iteration of `global_batch` items (default:
        the declared one): declared batches scaled in proportion."""
        scale = (global_batch or self.batch) / self.batch
        items = {c.name: max(1, round((c.component.batch or self.batch) * scale))
                 for c in self.components}
        for spec in self.components:
            unit = spec.component.micro_batch_multiple
            if items[spec.name] % unit:
                raise FlowDeclarationError(
                    f"an iteration of {global_batch} items gives {spec.name!r} "
                    f"{items[spec.name]} items, not whole units of its micro_batch_multiple="
                    f"{unit}: use a multiple")
        return items

    def to_sched_workflow(self) -> Workflow:
        """The workflow the planner prices (`rlinf.sched.plan`, `rlinf.sched.simulate`)."""
        lagged = set(self.trainers) if self.policy_lag else set()
        isolated = self.isolated
        return Workflow(tuple(dataclasses.replace(c.component, isolated=True)
                              if c.name in isolated else c.component for c in self.components),
                        tuple(dataclasses.replace(c.edge, lagged=True) if c.edge.dst in lagged
                              else c.edge for c in self.channels), global_batch=self.batch,
                        loops=self.loops, name=self.name)

    def fixed_plan(self, placement: str | Placement, *, num_devices: int) -> ExecutionPlan:
        """An unpriced plan (``predicted_time`` NaN) for a placement written by hand, e.g.
        ``"collocated"`` or ``"rollout: 0, reward,actor: 1"`` (`rlinf.sched.parse_placement`):
        every component takes its whole batch per call, every channel its `granularity`."""
        if isinstance(placement, Placement):
            parsed = placement
        else:
            try:
                parsed = parse_placement(placement, components=self.names,
                                         num_devices=num_devices)
            except PlacementError as exc:
                raise FlowDeclarationError(f"placement {placement!r}: {exc}") from exc
        if not parsed.components:
            raise FlowDeclarationError(
                f"placement {placement!r} names no devices: 'auto' is planned, not fixed — use "
                "rlinf.workers.flow.launch_auto (profile, fit, plan, launch)")
        unknown = sorted(set(parsed.component_names) - set(self.names))
        if unknown:
            raise UnknownComponentError(f"placement places unknown component(s) {unknown}")
        items = self.items()
        return ExecutionPlan(
            placement=parsed, micro_batch=dict(items),
            granularity={c.key: c.granularity or items[c.edge.dst] for c in self.channels},
            predicted_time=math.nan, utilisation=math.nan, label=parsed.mode.value)
