"""The runtime on a two-node Ray cluster on one machine: ranks on different nodes talk TCP.

`ray.cluster_utils.Cluster` starts a head node and a second node (separate raylets and
object stores) on this host, each with one CPU and a custom resource naming it, so a group
of two one-CPU ranks lands one rank per node. rlinf.comm treats the two Ray nodes as two
nodes (their locality carries the Ray node id), so tensors between the ranks travel the
cross-node path (Arrow IPC over TCP), while a rank and the driver on the head node use
shared memory. A rank killed on the other node surfaces as `WorkerDiedError` naming it.
With a cluster discovered from Ray (`Cluster.discover()`: its nodes carry Ray node ids) a
group pins rank i to the node that owns its placement device, and a placement naming a
device of a node Ray does not have fails with `ConfigError` before any rank starts.
Last, the reasoning app's `ReasoningFlow` runs one step unchanged with its roles on three
Ray nodes (rollout and actor apart, weights synced by a gloo broadcast across nodes).

The cluster lives in a private RAY_TMPDIR: a plain ``ray.init()`` elsewhere on this machine
must not find its address file and join it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from rlinf.comm import Channel, Endpoint, RayStore, new_token  # noqa: E402
from rlinf.comm._internal import transports  # noqa: E402
from rlinf.sched import Cluster  # noqa: E402
from rlinf.sched.placement import ComponentPlacement  # noqa: E402
from rlinf.workers.errors import ConfigError, WorkerCallError, WorkerDiedError  # noqa: E402
from rlinf.workers.runtime import (  # noqa: E402
    DispatchSpec,
    Gather,
    Worker,
    WorkerContext,
    WorkerGroup,
)

# Two raylets and two torch workers: ~25-60 s on a 2-core machine.
pytestmark = pytest.mark.slow

# Test modules are not importable in Ray's worker processes: ship these classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

NODE_RESOURCES = ("node_a", "node_b", "node_c")  # head, second node, third (flow test)
TENSOR_ROWS = 256  # 256 x 1024 float32 = 1 MiB: well above the inline (eager) limit


def make_tensors(seed: int) -> dict[str, Any]:
    """A deterministic batch of several dtypes, large enough to use a transport."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "hidden": torch.randn(TENSOR_ROWS, 1024, generator=gen),
        "tokens": torch.randint(0, 50_000, (TENSOR_ROWS, 64), generator=gen),
        "logp": torch.randn(TENSOR_ROWS, 64, generator=gen).to(torch.bfloat16),
        "mask": torch.rand(TENSOR_ROWS, 64, generator=gen) > 0.5,
    }


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        received = torch.as_tensor(got[name])
        assert received.dtype == tensor.dtype, name
        assert torch.equal(received, tensor), name


def count_transport_opens(counter: Counter[str]) -> Callable[[], None]:
    """Count, in this process, every payload opened by the shm and tcp transports.

    Wraps the process's transport instances (observation only: the payload still opens
    through the real transport); returns a function that removes the wrappers.
    """
    wrapped = []
    for name in ("shm", "tcp"):
        transport = transports.get_transport(name)
        original = transport.open

        def counted(*args: Any, _name: str = name, _original: Any = original,
                    **kwargs: Any) -> Any:
            counter[_name] += 1
            return _original(*args, **kwargs)

        transport.open = counted  # type: ignore[method-assign]
        wrapped.append(transport)

    def restore() -> None:
        for transport in wrapped:
            del transport.open

    return restore


class Peer(Worker):
    """One rank with its own rlinf.comm endpoint, named ``peer-<rank>``."""

    def __init__(self, context: WorkerContext, *, store_name: str, token: bytes) -> None:
        super().__init__(context)
        self.store = RayStore(store_name)
        self.endpoint = Endpoint(f"peer-{context.rank}", store=self.store, token=token)
        self.opened: Counter[str] = Counter()
        count_transport_opens(self.opened)
        self.channel: Channel | None = None
        self.producer: Channel

    def where(self) -> dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(),
                "node_ip": ray.util.get_node_ip_address(),
                "locality": self.endpoint.locality.to_dict(),
                "address": list(self.endpoint.address)}

    def send(self, dst: str, seed: int) -> None:
        self.endpoint.send(make_tensors(seed), dst, timeout=60)

    def recv(self, src: str, timeout: float = 60) -> tuple[dict[str, Any], dict[str, int]]:
        before = Counter(self.opened)
        batch = self.endpoint.recv(src, timeout=timeout)
        tensors = {n: torch.as_tensor(a).clone() for n, a in batch.tensors.items()}
        return tensors, dict(self.opened - before)

    def create_channel(self, name: str) -> None:
        self.channel = Channel.create(name, store=self.store, endpoint=self.endpoint)

    def put_items(self, name: str, seeds: list[int]) -> None:
        """Put items and keep the handle: a producer's payloads live in its memory."""
        self.producer = Channel.connect(name, store=self.store, endpoint=self.endpoint,
                                        timeout=60)
        for seed in seeds:
            self.producer.put(make_tensors(seed))

    def flush_items(self) -> None:
        """Wait until the consumer released every item (the acks crossed back)."""
        self.producer.flush(timeout=60)
        self.producer.disconnect()

    def get_items(self, count: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
        assert self.channel is not None
        before = Counter(self.opened)
        items = []
        for _ in range(count):
            batch = self.channel.get(timeout=60)
            items.append({n: torch.as_tensor(a).clone() for n, a in batch.tensors.items()})
            del batch  # the payload is released once its arrays die
        return items, dict(self.opened - before)

    def shutdown(self) -> None:
        if self.channel is not None:
            self.channel.disconnect()
        self.endpoint.close()
        super().shutdown()


class Where(Worker):
    """A light rank that says which Ray node it runs on."""

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())


@ray.remote
class _Busy:
    """Holds part of a node's CPUs, so Ray places what comes next elsewhere."""

    def ready(self) -> bool:
        return True


def on(rank: int) -> DispatchSpec:
    """Call one rank, return its result."""
    return DispatchSpec(gather=Gather.FIRST, ranks=(rank,))


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Any]:
    private = tempfile.mkdtemp(prefix="rl2n-")  # short: Ray's socket paths must stay < 108
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = private
    cluster = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {NODE_RESOURCES[0]: 1},
                        "include_dashboard": False},
    )
    try:
        cluster.add_node(num_cpus=1, resources={NODE_RESOURCES[1]: 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(private, ignore_errors=True)  # session logs and spilled objects


def node_names() -> dict[str, str]:
    """Ray node id → "node_a"/"node_b" from each node's custom resource."""
    out = {}
    for node in ray.nodes():
        if node["Alive"]:
            out[node["NodeID"]] = next(r for r in NODE_RESOURCES if r in node["Resources"])
    return out


@pytest.fixture(scope="module")
def peers(two_nodes: Any) -> Iterator[tuple[WorkerGroup, str, bytes]]:
    store_name = f"two-node-{os.getpid()}-{new_token().hex()[:6]}"
    token = new_token()
    group = WorkerGroup.launch(
        Peer, role="peer", num_ranks=2, num_cpus_per_rank=1.0,
        init_kwargs={"store_name": store_name, "token": token},
        env_vars={"RAY_AUTH_MODE": os.environ["RAY_AUTH_MODE"]},
        launch_timeout=180, call_timeout=120,
    )
    try:
        yield group, store_name, token
    finally:
        group.kill()


def test_ranks_on_two_nodes_exchange_tensors_over_tcp(
    peers: tuple[WorkerGroup, str, bytes],
) -> None:
    group = peers[0]
    names = node_names()
    where = group.call("where")
    assert {names[w["node_id"]] for w in where} == set(NODE_RESOURCES[:2])  # a rank per node
    assert [info.node_id for info in group.infos] == [w["node_id"] for w in where]
    # endpoints listen on the node's address (reachable from other nodes), not loopback
    assert all(w["address"][0] == w["node_ip"] for w in where)
    loc = [transports.Locality.from_dict(w["locality"]) for w in where]
    assert not loc[0].same_node(loc[1])
    assert transports.select_transport(loc[0], loc[1], make_tensors(0)) == "tcp"

    # point to point, both directions: the receiver opened exactly one TCP payload
    for src, dst, seed in ((1, 0, 11), (0, 1, 12)):
        group.call("send", f"peer-{dst}", seed, spec=on(src))
        got, opened = group.call("recv", f"peer-{src}", spec=on(dst))
        assert_same(got, make_tensors(seed))
        assert opened == {"tcp": 1}

    # a channel owned by rank 0; rank 1 (other node) produces, rank 0 consumes: the
    # consumer fetches each payload from the producer's node over TCP
    group.call("create_channel", "cross", spec=on(0))
    group.call("put_items", "cross", [21, 22, 23], spec=on(1))
    items, opened = group.call("get_items", 3, spec=on(0))
    for item, seed in zip(items, (21, 22, 23), strict=True):
        assert_same(item, make_tensors(seed))
    assert opened == {"tcp": 3}
    group.call("flush_items", spec=on(1))


def test_same_node_pair_still_uses_shared_memory(peers: tuple[WorkerGroup, str, bytes]) -> None:
    """Control: the driver (head node) gets shm from the head-node rank, TCP from the other."""
    group, store_name, token = peers
    names = node_names()
    head_rank = next(i for i, info in enumerate(group.infos)
                     if names[info.node_id] == NODE_RESOURCES[0])
    opened: Counter[str] = Counter()
    restore = count_transport_opens(opened)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(restore)
        driver = cleanup.enter_context(Endpoint("driver", store=RayStore(store_name), token=token))
        assert "/node:" in driver.locality.host_id  # the driver joined the head node's identity
        for rank, seed, want in ((head_rank, 31, "shm"), (1 - head_rank, 32, "tcp")):
            before = Counter(opened)
            group.call("send", "driver", seed, spec=on(rank))
            batch = driver.recv(f"peer-{rank}", timeout=60)
            assert_same(dict(batch.tensors), make_tensors(seed))
            assert dict(opened - before) == {want: 1}
            del batch


def test_killed_rank_on_the_other_node_raises_worker_died(
    peers: tuple[WorkerGroup, str, bytes],
) -> None:
    """Runs last: it kills one of the module's ranks."""
    group, _store, _token = peers
    names = node_names()
    far = next(i for i, info in enumerate(group.infos) if names[info.node_id] == NODE_RESOURCES[1])
    near = 1 - far
    # connect the pair first, then kill the far rank in the middle of a blocking recv
    group.call("send", f"peer-{far}", 41, spec=on(near))
    group.call("recv", f"peer-{near}", spec=on(far))
    pending = group.call_async("recv", f"peer-{near}", 90.0, spec=on(far))
    os.kill(group.infos[far].pid, signal.SIGKILL)
    with pytest.raises(WorkerDiedError, match=f"'peer' rank {far}") as died:
        pending.result(timeout=60)
    assert died.value.rank == far and died.value.method == "recv"
    # the survivor on the head node learns it too: sending to the dead peer fails, typed
    with pytest.raises(WorkerCallError, match="PeerDiedError") as failed:
        group.call("send", f"peer-{far}", 42, spec=on(near))
    assert failed.value.rank == near
    group.kill()  # frees both CPUs for the next test


def _free_per_node() -> dict[str, float]:
    """Free CPUs per live node (by its custom resource, or its id)."""
    free = ray._private.state.available_resources_per_node()
    out = {}
    for node in ray.nodes():
        if node["Alive"]:
            label = next((r for r in node["Resources"] if r in NODE_RESOURCES), node["NodeID"][:8])
            out[f"{label} ({node['Resources'].get('CPU', 0):g} CPU)"] = free.get(
                node["NodeID"], {}).get("CPU", 0.0)
    return out


def _live_actors() -> list[str]:
    """Class, state and name of every actor the GCS does not report dead."""
    try:
        table = ray._private.state.actors()  # the GCS's table; the state API needs a dashboard
    except Exception as exc:
        return [f"(actor table unavailable: {exc!r})"]
    return [f"{a.get('ActorClassName')}/{a.get('State')}/{a.get('Name') or '-'}/"
            f"{a.get('RequiredResources')}" for a in table.values()
            if a.get("State") != "DEAD"]


def _wait_for_cpus(total: float, *, timeout: float = 60.0) -> None:
    """Ray returns a killed actor's CPUs asynchronously: wait until all are free again."""
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("CPU", 0.0) < total:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ray still holds CPUs of killed actors after {timeout} s: "
                               f"{_free_per_node()}; actors not dead: {_live_actors()}")
        time.sleep(0.2)


def test_placement_pins_each_rank_to_the_node_owning_its_device(two_nodes: Any) -> None:
    """Two CPU slots per node: devices 0-1 on the head node, 2-3 on the second. Ranks on
    devices (1, 2, 3) land head, second, second; unpinned, Ray would fill the head first."""
    _wait_for_cpus(2)
    cluster = Cluster.discover(cpu_slots=2)
    names = node_names()
    assert [names[str(n.ray_node_id)] for n in cluster.nodes] == list(NODE_RESOURCES[:2])
    devices = (1, 2, 3)
    group = WorkerGroup.launch(Where, placement=ComponentPlacement("where", devices),
                               cluster=cluster, num_cpus_per_rank=0.25, launch_timeout=180,
                               call_timeout=60)
    try:
        reported = group.call("node_id")
        owners = [cluster.nodes[cluster.node_of(d)].ray_node_id for d in devices]
        assert reported == owners
        assert [names[r] for r in reported] == ["node_a", "node_b", "node_b"]
        assert [info.node_id for info in group.infos] == reported
    finally:
        group.kill()


def _named_actors(prefix: str) -> list[str]:
    return [a for a in ray.util.list_named_actors() if a.startswith(prefix)]


def test_placement_beyond_the_live_nodes_fails_before_any_rank_starts(two_nodes: Any) -> None:
    cluster = Cluster.discover(cpu_slots=2)  # devices 0-3
    with pytest.raises(ConfigError, match=r"rank 1 on device 4, but no node of the Ray "
                                          r"cluster has it: .*devices 0-1.*devices 2-3"):
        WorkerGroup.launch(Where, placement=ComponentPlacement("missing", (0, 4)),
                           cluster=cluster, num_cpus_per_rank=0.25)
    assert _named_actors("missing-") == []  # no rank was created, not even rank 0


@pytest.mark.parametrize("placement", ["env,rollout: 0-1, actor: 0",
                                       "env: 0, rollout: 1, actor: 0"])
def test_embodied_flow_across_two_nodes_matches_one_node(two_nodes: Any, placement: str) -> None:
    """The embodied flow with its roles pinned to two Ray nodes. ``env,rollout: 0-1``: an env
    worker (with its inline policy) on each node; env rank 1 sends its trajectory to the
    actor across nodes and its policy gets the weights by a gloo broadcast. ``env: 0,
    rollout: 1``: the env ↔ policy loop itself crosses nodes (endpoint messages over TCP,
    no shared-memory ring). Every metric but the timings equals the same plan's on one
    machine's logical slots."""
    pytest.importorskip("rlinf_embodied.flow")
    from rlinf_embodied.flow import EmbodiedFlow, EmbodiedSpec, fixed_plan

    from rlinf.workers.embodied.actor import EmbodiedActorConfig
    from rlinf.workers.env import EnvWorkerConfig
    from rlinf.workers.models.policy import PolicyConfig

    _wait_for_cpus(2)
    spec = EmbodiedSpec(
        env=EnvWorkerConfig("InvertedPendulum-v5", num_envs=4, pipeline_stages=2, seed=3,
                            max_episode_steps=30),
        policy=PolicyConfig(obs_shape=(4,), action_dim=1, hidden_sizes=(16, 16)),
        actor=EmbodiedActorConfig(epochs=1, num_minibatches=2),
        rollout_steps=8, seed=1, torch_threads=1, link_timeout=60.0)
    plan = fixed_plan(spec, placement, num_devices=2)
    timing = {"env_steps_per_s", "rollout_steps_per_s", "rollout_seconds", "train_seconds",
              "sync_seconds", "env_step_seconds", "env_wait_seconds", "iteration_seconds"}

    def outcomes(flow: EmbodiedFlow) -> list[dict[str, float]]:
        return [{k: v for k, v in flow.step(s).metrics.items() if k not in timing}
                for s in range(2)]

    cluster = Cluster.discover(cpu_slots=1)  # a device per Ray node, with its node id
    assert cluster.num_devices == 2 and all(n.ray_node_id for n in cluster.nodes)
    names = node_names()
    with EmbodiedFlow.launch(spec, plan, cluster=cluster) as flow:
        for role, group in flow.run.groups.items():  # each rank on its device's node
            for rank, info in enumerate(group.infos):
                device = plan.placement.devices_of(role)[rank]
                assert names[info.node_id] == NODE_RESOURCES[device], (role, rank)
        assert flow.run.weight_transports == ("gloo",)  # the weights cross nodes
        across = outcomes(flow)
    with EmbodiedFlow.launch(spec, plan) as flow:  # logical slots: wherever Ray puts it
        local = outcomes(flow)
    assert across == local
    assert all(math.isfinite(v) for row in across for v in row.values())


def test_reasoning_flow_step_with_rollout_and_actor_on_different_nodes(two_nodes: Any) -> None:
    """The reasoning app's flow runs unchanged across Ray nodes: rollout and actor on
    different nodes, weights actor → rollout by gloo broadcast over TCP.

    The cluster is discovered (its nodes carry Ray node ids), and the flow hands it to
    `WorkerGroup.launch`, so each role runs on the node that owns its device; the weight-sync
    transport follows the nodes the ranks report.
    """
    flow_mod = pytest.importorskip("rlinf_reasoning.flow")
    from rlinf_reasoning.spec import FlowSpec
    from rlinf_reasoning.workflow import fixed_plan

    from rlinf.envs.math import ProblemGenerator
    from rlinf.workers.actor import ActorConfig
    from rlinf.workers.models import TinyLMConfig
    from rlinf.workers.models.sources import ModelSource
    from rlinf.workers.rollout import RolloutGeneratorConfig, SamplingConfig

    two_nodes.add_node(num_cpus=1, resources={NODE_RESOURCES[2]: 1})
    two_nodes.wait_for_nodes()
    _wait_for_cpus(3)
    spec = FlowSpec(
        model=ModelSource(config=TinyLMConfig(
            hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
            attn_implementation="eager")),
        rollout=RolloutGeneratorConfig(group_size=2, groups_per_micro_batch=2,
                                    sampling=SamplingConfig(max_new_tokens=8, temperature=1.0),
                                    template="short"),
        actor=ActorConfig(lr=1e-3, micro_batch_size=4, mini_batch_size=None, epochs=1,
                          kl_coef=0.0, temperature=1.0, parallelism="ddp"),
        recompute_logprobs=False, prompts_per_step=4, timeout=240.0)
    # One logical CPU device per Ray node, discovered: each node carries its Ray node id.
    cluster = Cluster.discover(cpu_slots=1)
    assert cluster.num_devices == 3 and all(n.ray_node_id for n in cluster.nodes)
    plan = fixed_plan(spec, "rollout: 0, reward: 1, actor: 2", num_devices=3,
                               granularity_groups=2)
    names = node_names()
    assert len(names) == 3
    problems = ProblemGenerator().generate(4)
    with flow_mod.ReasoningFlow.launch(spec, plan, cluster=cluster,
                                       problems=lambda step, groups: problems) as flow:
        nodes = {role: names[group.infos[0].node_id] for role, group in flow.groups.items()}
        assert sorted(nodes.values()) == sorted(NODE_RESOURCES), nodes  # a node per role
        for role, group in flow.groups.items():  # pinned: the node that owns its device
            (device,) = plan.placement.devices_of(role)
            owner = cluster.nodes[cluster.node_of(device)].ray_node_id
            assert group.infos[0].node_id == owner, (role, device)
        assert nodes["rollout"] != nodes["actor"]
        assert flow.transport == "gloo"  # cross-node CPU weight sync
        result = flow.step(1)
    assert result.samples == 4 * 2 and result.tokens > 0
    assert all(math.isfinite(v) for v in result.metrics.values()), result.metrics


def test_placement_on_a_node_that_left_fails_before_any_rank_starts(two_nodes: Any) -> None:
    """Runs after the flow test (which added a third node): discover, remove that node, and
    launch on its device."""
    if len(two_nodes.worker_nodes) < 2:
        two_nodes.add_node(num_cpus=1, resources={NODE_RESOURCES[2]: 1})
        two_nodes.wait_for_nodes()
    cluster = Cluster.discover(cpu_slots=1)  # a device per node: 0 head, 1 and 2 the others
    names = node_names()
    third = next(n for n in cluster.nodes if names[str(n.ray_node_id)] == NODE_RESOURCES[2])
    leaving = next(n for n in two_nodes.worker_nodes if n.node_id == third.ray_node_id)
    two_nodes.remove_node(leaving)
    deadline = time.monotonic() + 60
    while any(n["NodeID"] == third.ray_node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, "Ray still reports the removed node alive"
        time.sleep(0.2)
    (device,) = third.devices
    with pytest.raises(ConfigError, match=rf"rank 1 on device {device} of node "
                                          rf"{third.index} .*not alive in the Ray cluster"):
        WorkerGroup.launch(Where, placement=ComponentPlacement("left", (0, device)),
                           cluster=cluster, num_cpus_per_rank=0.25)
    assert _named_actors("left-") == []


# 92 s on CI's slower host: tox -e test-long runs it; the embodied node-loss run below stays in CI.
@pytest.mark.long
def test_reasoning_run_that_loses_a_node_replans_for_the_devices_left_and_finishes(
    two_nodes: Any, tmp_path: Any,
) -> None:
    """Runs last (#13): a collocated ``rlinf-reasoning`` run with ``run.max_restarts=1`` on
    the head and the second node (a CPU slot each); once it checkpointed step 2, the second
    node's raylet is killed. The run restarts from its checkpoint, finds one device left,
    plans again for it and finishes every step."""
    import threading

    cli = pytest.importorskip("rlinf_reasoning.cli")
    from rlinf_reasoning.config import from_omegaconf
    from rlinf_reasoning.run import train

    from rlinf.workers.telemetry.checkpoints import CheckpointStore

    if not any(NODE_RESOURCES[1] in n["Resources"] for n in ray.nodes() if n["Alive"]):
        two_nodes.add_node(num_cpus=1, resources={NODE_RESOURCES[1]: 1})
        two_nodes.wait_for_nodes()
    for node in list(two_nodes.worker_nodes):  # keep exactly the head and the second node
        if not any(n["NodeID"] == node.node_id and NODE_RESOURCES[1] in n["Resources"]
                   for n in ray.nodes()):
            two_nodes.remove_node(node)
    second = next(n for n in two_nodes.worker_nodes if any(
        r["NodeID"] == n.node_id and NODE_RESOURCES[1] in r["Resources"] for r in ray.nodes()))
    _wait_for_cpus(2)
    run_dir = tmp_path / "run"
    cfg = from_omegaconf(cli.compose_config(
        ["placement=collocated", "cluster.cpu_slots=1", "run.steps=5", "run.checkpoint_every=1",
         "run.eval_every=0", "data.heldout_size=4", "run.predict=false", "run.max_restarts=1",
         "run.loggers=[jsonl]"], run_dir=str(run_dir)))
    removed = threading.Event()

    def lose_the_second_node() -> None:
        deadline = time.monotonic() + 600
        store = CheckpointStore(run_dir / "checkpoints")
        while (store.latest() or (0,))[0] < 2:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        two_nodes.remove_node(second, allow_graceful=False)
        removed.set()

    killer = threading.Thread(target=lose_the_second_node, daemon=True)
    killer.start()
    summary = train(cfg, out=sys.stdout)
    killer.join(timeout=60)
    assert removed.is_set(), "the run finished before the node could be removed"
    assert summary.steps == 5
    (restart,) = summary.restarts
    assert "re-planned for the 1 device(s) left" in restart, restart
    assert summary.placement.endswith(": 0"), summary.placement  # every role on device 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["run/devices"] for r in records if "run/devices" in r] == [1.0]
    assert max(r["step"] for r in records) == 5


def _keep_head_and_second_node(two_nodes: Any) -> Any:
    """Bring the cluster to the head and the second node (a CPU each); the second node.

    Which nodes run is what the fixture's own list says: a node the test before killed
    (its raylet, without a goodbye) stays "Alive" in Ray's node table until the GCS's
    health check gives up on it, so the table cannot tell whether one must be added."""
    def carries_second(node: Any) -> bool:
        return any(n["NodeID"] == node.node_id and NODE_RESOURCES[1] in n["Resources"]
                   for n in ray.nodes())

    for node in list(two_nodes.worker_nodes):
        if not carries_second(node):
            two_nodes.remove_node(node)
    if not two_nodes.worker_nodes:
        two_nodes.add_node(num_cpus=1, resources={NODE_RESOURCES[1]: 1})
        two_nodes.wait_for_nodes()
    _wait_for_cpus(2, timeout=180.0)
    return next(n for n in two_nodes.worker_nodes if carries_second(n))


def test_embodied_run_that_loses_a_node_restarts_on_the_node_left_and_finishes(
    two_nodes: Any, tmp_path: Any,
) -> None:
    """Runs after the reasoning one (#13): a collocated ``rlinf-embodied`` run with
    ``run.max_restarts=1`` whose head node is busy (a 0.6-CPU actor), so Ray puts one of its
    two 0.25-CPU ranks on the second node; once iteration 2 is checkpointed that node's
    raylet is killed and the head freed. The embodied placement's devices are logical CPU
    slots, not Ray nodes, so its plan still holds: the run restarts from its checkpoint on
    the head and finishes every iteration."""
    import threading

    pytest.importorskip("rlinf_embodied.cli")
    from rlinf_embodied.cli import load_config
    from rlinf_embodied.run import train

    from rlinf.workers.telemetry.checkpoints import CheckpointStore

    second = _keep_head_and_second_node(two_nodes)
    hog = _Busy.options(num_cpus=0.6, resources={NODE_RESOURCES[0]: 0.5}).remote()
    ray.get(hog.ready.remote())
    run_dir = tmp_path / "run"
    cfg = load_config(["placement=collocated", "run.iterations=20", "run.rollout_steps=64",
                       "env.num_envs=4", "env.pipeline_stages=2", "algorithm.epochs=2",
                       "algorithm.num_minibatches=4", "policy.hidden_sizes=[16,16]",
                       "run.eval_episodes=2", "env.max_episode_steps=50",
                       "run.eval_max_steps=50", "run.checkpoint_every=2", "run.video=false",
                       "run.max_restarts=1"], run_dir=run_dir)
    removed = threading.Event()

    def lose_the_second_node() -> None:
        deadline = time.monotonic() + 600
        store = CheckpointStore(run_dir / "checkpoints")
        while (store.latest() or (0,))[0] < 2:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        two_nodes.remove_node(second, allow_graceful=False)
        ray.kill(hog)
        removed.set()

    killer = threading.Thread(target=lose_the_second_node, daemon=True)
    killer.start()
    summary = train(cfg, stream=sys.stdout)
    killer.join(timeout=60)
    assert removed.is_set(), "the run finished before the node could be removed"
    assert summary.steps == 20
    (restart,) = summary.restarts
    assert "died; went on from iteration 2" in restart, restart
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in records) == 20
