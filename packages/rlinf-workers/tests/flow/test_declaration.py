"""`MacroFlow` declarations: what the planner sees, fixed plans, and bad declarations that
fail with typed errors naming the problem (no Ray needed)."""

from __future__ import annotations

import itertools
import math

import pytest

from rlinf.sched import Component, Edge, ExecutionMode, Loop, Placement
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import (
    ChannelSpec,
    ComponentSpec,
    FlowChannel,
    FlowDeclarationError,
    MacroFlow,
    StepContext,
    WeightSyncSpec,
)
from rlinf.workers.flow.channels import paired_ranks
from rlinf.workers.flow.errors import FlowCycleError, UnknownComponentError, WeightSyncTargetError
from rlinf.workers.flow.records import IterationRecord, PhaseRecord, profile_of
from rlinf.workers.runtime import Worker

from .toys import LoopEnv, LoopPolicy, Relay, Sink, Source

UNIT = 2  # items per unit: every component's micro_batch_multiple


def source(name: str = "source", batch: int = 8) -> ComponentSpec:
    return ComponentSpec(Component(name, resource="cpu", batch=batch, micro_batch_multiple=UNIT),
                         Source, entry="produce")


def sink(name: str = "sink", batch: int = 8) -> ComponentSpec:
    return ComponentSpec(Component(name, batch=batch, micro_batch_multiple=UNIT), Sink,
                         entry="consume", setup="build", distributed=True)


def relay(name: str = "relay") -> ComponentSpec:
    return ComponentSpec(Component(name, batch=8, micro_batch_multiple=UNIT), Relay,
                         entry="relay")


def chain(*names: str, granularity: int = UNIT) -> tuple[ChannelSpec, ...]:
    return tuple(ChannelSpec(Edge(a, b, bytes_per_item=64), granularity=granularity)
                 for a, b in itertools.pairwise(names))


def test_the_planner_sees_the_declared_components_edges_and_loops() -> None:
    flow = MacroFlow((source(), relay(), sink()), chain("source", "relay", "sink"),
                     weight_syncs=(WeightSyncSpec("sink", ("source",)),), name="toy")
    workflow = flow.to_sched_workflow()
    assert workflow.names == ("source", "relay", "sink")
    assert [e.key for e in workflow.edges] == ["source->relay", "relay->sink"]
    assert workflow.global_batch == 8 and workflow.component("source").resource == "cpu"
    assert flow.items(16) == {"source": 16, "relay": 16, "sink": 16}
    assert flow.unit_of(flow.channels[0]) == UNIT
    # a loop is translated for the planner, and its members learn their step count
    looped = loop_flow()
    assert looped.to_sched_workflow().steps_of("policy") == 5
    assert looped.loop_steps == {"env": 5, "policy": 5}


def loop_flow(*, policy_inline_with: str | None = "env", extra: tuple[ChannelSpec, ...] = ()
              ) -> MacroFlow:
    env = ComponentSpec(Component("env", resource="cpu", batch=8, micro_batch_multiple=UNIT),
                        LoopEnv, entry="rollout")
    policy = ComponentSpec(Component("policy", batch=8, micro_batch_multiple=UNIT), LoopPolicy,
                           entry="serve", inline_with=policy_inline_with,
                           inline_kwargs={"inline_offset": 1})
    return MacroFlow(
        (env, policy, sink("actor")),
        (ChannelSpec(Edge("env", "policy")), ChannelSpec(Edge("policy", "env", feedback=True)),
         ChannelSpec(Edge("env", "actor")), *extra),
        loops=(Loop(("env", "policy"), steps=5),))


def test_an_inlinable_component_runs_inside_its_host_only_where_placed_with_it() -> None:
    flow = loop_flow()
    same = flow.fixed_plan("env,policy: 0, actor: 1", num_devices=2).placement
    assert flow.inlined(same) == {"policy": "env"}
    # As many ranks on the same devices: host rank r serves the guest's rank r.
    for together in ("env,policy: 0x2, actor: 1", "env,policy: 0-1, actor: 0"):
        placement = flow.fixed_plan(together, num_devices=2).placement
        assert flow.inlined(placement) == {"policy": "env"}
    for apart in ("env: 0, policy: 1, actor: 0-1", "env: 0, policy,actor: 0-1",
                  "env: 0x2, policy: 0, actor: 1"):  # other devices, or other rank counts
        assert flow.inlined(flow.fixed_plan(apart, num_devices=2).placement) == {}
    with pytest.raises(FlowDeclarationError, match="num_gpus must be >= 0"):
        MacroFlow((ComponentSpec(Component("s"), Source, entry="produce", num_gpus=-0.5),))
    with pytest.raises(UnknownComponentError, match="inline_with='critic'"):
        loop_flow(policy_inline_with="critic")
    with pytest.raises(FlowDeclarationError, match=r"channels \['policy->actor'\]"):
        loop_flow(extra=(ChannelSpec(Edge("policy", "actor")),))


def test_an_entry_with_several_channels_a_side_must_take_mappings() -> None:
    # Relay takes one input_channel; as the loop's policy it would get two inputs
    with pytest.raises(FlowDeclarationError, match=r"2 input channels.*take inputs="):
        MacroFlow((ComponentSpec(Component("env", batch=8, micro_batch_multiple=UNIT), LoopEnv,
                                 entry="rollout"), relay("policy"), source("extra")),
                  (ChannelSpec(Edge("env", "policy")), ChannelSpec(Edge("extra", "policy"))))
    with pytest.raises(FlowDeclarationError, match="takes neither outputs= nor output_channel="):
        MacroFlow((sink("a"), sink("b")), chain("a", "b"))  # consume has no output channel


def test_fixed_plans_parse_the_placement_syntax() -> None:
    flow = MacroFlow((source(), relay(), sink()), chain("source", "relay", "sink"))
    plan = flow.fixed_plan("source: 0, relay,sink: 1", num_devices=2)
    assert plan.mode is ExecutionMode.HYBRID and math.isnan(plan.predicted_time)
    assert plan.granularity == {"source->relay": 2, "relay->sink": 2}
    assert plan.micro_batch == {"source": 8, "relay": 8, "sink": 8}
    assert flow.fixed_plan("collocated", num_devices=2).placement.devices_of("sink") == (0, 1)
    with pytest.raises(FlowDeclarationError, match="auto"):
        flow.fixed_plan("auto", num_devices=2)
    with pytest.raises(FlowDeclarationError, match="placement"):
        flow.fixed_plan("source: 0, relay: 1", num_devices=2)  # sink not placed


def test_a_channel_naming_an_unknown_component_is_refused() -> None:
    with pytest.raises(UnknownComponentError, match=r"source->trainer.*'trainer'"):
        MacroFlow((source(), sink()), chain("source", "trainer"))


def test_a_cycle_without_a_loop_is_refused_and_named() -> None:
    channels = (*chain("source", "relay", "sink"), ChannelSpec(Edge("sink", "source")))
    with pytest.raises(FlowCycleError, match=r"cycle .*source.*feedback"):
        MacroFlow((source(), relay(), sink()), channels)
    # a feedback edge outside any loop is refused by the planner's own check
    bad = (*chain("source", "sink"), ChannelSpec(Edge("sink", "source", feedback=True)))
    with pytest.raises(FlowDeclarationError, match="feedback"):
        MacroFlow((source(), sink()), bad)


def test_weight_sync_needs_declared_targets_that_can_receive() -> None:
    parts, channels = (source(), sink()), chain("source", "sink")
    with pytest.raises(WeightSyncTargetError, match="no target"):
        MacroFlow(parts, channels, weight_syncs=(WeightSyncSpec("sink", ()),))
    with pytest.raises(WeightSyncTargetError, match=r"undeclared component\(s\) \['rollout'\]"):
        MacroFlow(parts, channels, weight_syncs=(WeightSyncSpec("sink", ("rollout",)),))
    with pytest.raises(UnknownComponentError, match="trainer"):
        MacroFlow(parts, channels, weight_syncs=(WeightSyncSpec("trainer", ("source",)),))
    with pytest.raises(WeightSyncTargetError, match=r"'relay' \(Relay\) is the receiver but "
                                                     r"lacks \['receive_weights'"):
        MacroFlow((source(), relay(), sink()), chain("source", "relay", "sink"),
                  weight_syncs=(WeightSyncSpec("sink", ("relay",)),))


def test_a_weight_sync_transport_is_one_the_runtime_has() -> None:
    parts, channels = (source(), sink()), chain("source", "sink")
    with pytest.raises(WeightSyncTargetError, match=r"transport must be one of \['auto'"):
        MacroFlow(parts, channels, weight_syncs=(
            WeightSyncSpec("sink", ("source",), "inprocess"),))  # type: ignore[arg-type]
    forced = (WeightSyncSpec("sink", ("source",), "cuda_ipc"),)
    with pytest.raises(WeightSyncTargetError, match="'cuda_ipc' needs device='cuda'"):
        MacroFlow(parts, channels, weight_syncs=forced)
    ipc = MacroFlow(parts, channels, weight_syncs=forced, device="cuda")
    assert ipc.weight_syncs[0].transport == "cuda_ipc"


def test_other_bad_declarations_say_what_to_fix() -> None:
    with pytest.raises(FlowDeclarationError, match="more than once"):
        MacroFlow((source(), source()))
    with pytest.raises(FlowDeclarationError, match="not a subclass"):
        MacroFlow((ComponentSpec(Component("w"), Worker, entry="profile"),))  # type: ignore[arg-type]
    with pytest.raises(FlowDeclarationError, match="entry method 'missing'"):
        MacroFlow((ComponentSpec(Component("s"), Source, entry="missing"),))
    with pytest.raises(FlowDeclarationError, match="twice"):
        MacroFlow((source(), sink()), chain("source", "sink") * 2)
    with pytest.raises(UnknownComponentError, match="loop"):
        MacroFlow((source(), sink()), chain("source", "sink"), loops=(Loop(("env",), 2),))
    with pytest.raises(FlowDeclarationError, match="micro_batch_multiple=2"):
        MacroFlow((source(), sink()), chain("source", "sink", granularity=3))
    with pytest.raises(FlowDeclarationError, match="whole units"):
        MacroFlow((source(), sink()), chain("source", "sink")).items(global_batch=5)
    # every declaration error is also a ConfigError / ValueError
    assert issubclass(FlowCycleError, ConfigError) and issubclass(FlowCycleError, ValueError)


def test_channel_routing_is_a_function_of_the_unit_index() -> None:
    robin = FlowChannel("a", "b", "run/a->b", "store", consumer_ranks=3, unit=2,
                        items_per_message=5)
    assert robin.units(14) == 7 and robin.units_per_message == 2
    assert [robin.rank_of(i, 7) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert robin.indices(1, 7) == range(1, 7, 3) and robin.key_of(4, 7) == "r1"
    shard = FlowChannel("a", "b", "run/a->b", "store", consumer_ranks=3, sharding="contiguous")
    # torch.tensor_split's rule: 7 units over 3 ranks -> 3, 2, 2
    assert [list(shard.indices(r, 7)) for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    for total in range(1, 12):
        for rank in range(3):
            assert all(shard.rank_of(i, total) == rank for i in shard.indices(rank, total))
    with pytest.raises(ConfigError, match="multiple of 2"):
        robin.units(5)
    with pytest.raises(ConfigError, match="sharding"):
        FlowChannel("a", "b", "n", "s", consumer_ranks=1, sharding="random")  # type: ignore[arg-type]


def test_a_consumer_rank_without_a_unit_is_refused() -> None:
    shard = FlowChannel("a", "b", "run/a->b", "store", consumer_ranks=3, unit=2,
                        sharding="contiguous")
    shard.check_shards(6)  # one unit per rank
    with pytest.raises(ConfigError, match=r"4 items are 2 units of 2, too few for 3 'b' ranks"):
        shard.check_shards(4)


def test_records_become_a_profile_the_planner_can_fit() -> None:
    placement = Placement.from_dict(MacroFlow((source(), sink()), chain("source", "sink"))
                                    .fixed_plan("source: 0, sink: 1", num_devices=2)
                                    .placement.to_dict())
    ctx = StepContext(step=0, items={"source": 8, "sink": 8}, ranks={"source": 1, "sink": 1},
                      placement=placement)
    assert not ctx.shares_devices("source", "sink")
    with pytest.raises(ConfigError, match=">= 1 item"):
        StepContext(step=0, items={"source": 0}, ranks={}, placement=placement)
    phases = (PhaseRecord("source", 0.0, 0.5, 0.4, items=8, num_devices=1,
                          peak_memory_bytes=10, memory_source="rss",
                          switches=(("onload", 0.01),)),
              PhaseRecord("weight_sync:sink", 0.5, 0.6, 0.1))
    profile = profile_of([IterationRecord(0, 0.6, phases)])
    (measured,) = profile.measurements
    assert (measured.component, measured.batch_size, measured.seconds) == ("source", 8, 0.4)
    assert [(s.component, s.direction) for s in profile.switches] == [("source", "onload")]


def test_p2p_ranks_pair_modulo_the_smaller_end() -> None:
    channel = FlowChannel(src="env", dst="policy", name="n", store="s", consumer_ranks=2,
                          producer_ranks=4, transport="p2p")
    assert [channel.peers("env", r) for r in range(4)] == [(0,), (1,), (0,), (1,)]
    assert channel.peers("policy", 0) == (0, 2) and channel.peers("policy", 1) == (1, 3)
    assert paired_ranks(0, mine=1, theirs=1) == (0,)
    with pytest.raises(ConfigError, match="divides"):
        paired_ranks(0, mine=2, theirs=3)
    with pytest.raises(ConfigError, match="not an end"):
        channel.peers("actor", 0)


def test_profiling_runs_on_device_counts_every_component_allows() -> None:
    """A trainer cut in pairs of devices is profiled on 2 and on the largest even count,
    never on 1; a cluster on which no count fits every component is refused."""
    from rlinf.sched import Cluster
    from rlinf.workers.flow.auto import profile_device_counts

    def flow(multiple: int) -> MacroFlow:
        trainer = ComponentSpec(Component("sink", batch=8, micro_batch_multiple=UNIT,
                                          device_multiple=multiple, min_devices=multiple),
                                Sink, entry="consume", setup="build", distributed=True)
        return MacroFlow((source(), trainer), chain("source", "sink"))

    assert profile_device_counts(flow(1), Cluster.uniform(1, 5, int(8e9))) == [1, 5]
    assert profile_device_counts(flow(2), Cluster.uniform(1, 5, int(8e9))) == [2, 4]
    assert profile_device_counts(flow(2), Cluster.uniform(1, 2, int(8e9))) == [2]
    with pytest.raises(ConfigError, match=r"no device count in 1\.\.3"):
        profile_device_counts(flow(4), Cluster.uniform(1, 3, int(8e9)))


def test_components_on_one_device_group_share_a_process_unless_the_placement_parts_them(
) -> None:
    """On one device env, its inline policy and a one-process trainer run in one process; a
    trainer spanning devices has its own (its process is no device's), and so do the ends
    of a p2p link between two processes (an endpoint is named after its component)."""
    env = ComponentSpec(Component("env", resource="cpu", batch=8, micro_batch_multiple=UNIT),
                        LoopEnv, entry="rollout")
    policy = ComponentSpec(Component("policy", batch=8, micro_batch_multiple=UNIT), LoopPolicy,
                           entry="serve", inline_with="env", inline_kwargs={"inline_offset": 1})
    actor = ComponentSpec(Component("actor", batch=8, micro_batch_multiple=UNIT), Sink,
                          entry="consume", one_process=True)
    flow = MacroFlow(
        (env, policy, actor),
        (ChannelSpec(Edge("env", "policy"), transport="p2p"),
         ChannelSpec(Edge("policy", "env", feedback=True), transport="p2p"),
         ChannelSpec(Edge("env", "actor"))),
        loops=(Loop(("env", "policy"), steps=5),))

    def sets(spec: str) -> tuple[tuple[str, ...], ...]:
        return flow.process_sets(flow.fixed_plan(spec, num_devices=2).placement)

    assert sets("env,policy,actor: 0") == (("env", "actor"),)
    assert sets("env,policy: 0-1, actor: 0-1") == (("env",), ("actor",))
    assert set(sets("env,actor: 0, policy: 1")) == {("env",), ("policy",), ("actor",)}
    assert flow.isolated == frozenset()  # nothing is apart under every placement
