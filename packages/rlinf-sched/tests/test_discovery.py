"""Cluster discovery from Ray's node records (no Ray cluster: records as ``ray.nodes()``)."""

from __future__ import annotations

from typing import Any

import pytest

from rlinf.sched import _discovery
from rlinf.sched._discovery import ray_nodes
from rlinf.sched.cluster import Cluster, _Builder


def record(node_id: str, address: str, *, cpus: float, alive: bool = True,
           resources: dict[str, float] | None = None) -> dict[str, Any]:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": address,
            "NodeManagerHostname": f"host-{address}",
            "Resources": {"CPU": cpus, "memory": 4e9, **(resources or {})}}


def build(infos: list[dict[str, Any]]) -> Cluster:
    builder = _Builder()
    for info in infos:
        builder.add_node(**info)
    return builder.build(name="t", intra_node_bandwidth=1.0, inter_node_bandwidth=1.0)


@pytest.fixture(autouse=True)
def no_local_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_discovery, "local_gpus", list)


def test_nodes_carry_ray_ids_local_first() -> None:
    nodes = [record("cc", "10.0.0.3", cpus=1), record("bb", "10.0.0.1", cpus=2),
             record("dd", "10.0.0.9", cpus=4, alive=False), record("aa", "10.0.0.1", cpus=1)]
    # two Ray nodes share the driver's IP (one machine): the driver's node id decides
    cluster = build(list(ray_nodes(nodes, local_node_id="bb", local_ip="10.0.0.1",
                                   cpu_slots=None)))
    assert [n.ray_node_id for n in cluster.nodes] == ["bb", "aa", "cc"]  # dead node left out
    assert [n.devices for n in cluster.nodes] == [(0, 1), (2,), (3,)]
    assert [n.address for n in cluster.nodes] == ["10.0.0.1", "10.0.0.1", "10.0.0.3"]
    # descriptions do not carry session-bound ids
    assert all(n.ray_node_id is None for n in Cluster.from_dict(cluster.to_dict()).nodes)


def test_gpu_nodes_and_cpu_slots() -> None:
    nodes = [record("aa", "10.0.0.1", cpus=8),
             record("bb", "10.0.0.2", cpus=16,
                    resources={"GPU": 2, "accelerator_type:H100": 1})]
    cluster = build(list(ray_nodes(nodes, local_node_id="aa", local_ip="10.0.0.1",
                                   cpu_slots=3)))
    assert [d.kind for d in cluster.devices] == ["cpu"] * 3 + ["H100"] * 2
    assert cluster.nodes[1].ray_node_id == "bb"
    assert cluster.node_of(4) == 1


def test_local_node_by_ip_without_a_node_id() -> None:
    nodes = [record("aa", "10.0.0.1", cpus=1), record("bb", "10.0.0.2", cpus=1)]
    infos = list(ray_nodes(nodes, local_node_id="", local_ip="10.0.0.2", cpu_slots=None))
    assert [i["ray_node_id"] for i in infos] == ["bb", "aa"]


def test_discovery_without_ray_has_no_node_ids() -> None:
    cluster = Cluster.discover(use_ray=False, cpu_slots=2)
    assert [n.ray_node_id for n in cluster.nodes] == [None]


def test_gpus_false_makes_every_node_cpu_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_discovery, "local_gpus",
                        lambda: [_discovery.LocalGpu("H100", 80 << 30, True)])
    nodes = [record("aa", "10.0.0.1", cpus=8, resources={"GPU": 1}),
             record("bb", "10.0.0.2", cpus=16, resources={"GPU": 2})]
    with_gpus = build(list(ray_nodes(nodes, local_node_id="aa", local_ip="10.0.0.1",
                                     cpu_slots=2)))
    assert [d.kind for d in with_gpus.devices] == ["H100", "gpu", "gpu"]
    slots = build(list(ray_nodes(nodes, local_node_id="aa", local_ip="10.0.0.1",
                                 cpu_slots=2, gpus=False)))
    assert [d.kind for d in slots.devices] == ["cpu"] * 4
    local = Cluster.discover(use_ray=False, cpu_slots=3, gpus=False)
    assert not local.has_gpus and local.num_devices == 3
    assert Cluster.discover(use_ray=False, cpu_slots=3).has_gpus  # the GPU counts by default


def test_the_local_node_has_at_most_its_cores_whatever_ray_declares() -> None:
    # ``ray start --num-cpus=8`` on a 2-core machine: 2 cores and 2 slots by default, as
    # without Ray; another node keeps Ray's count, and an explicit cpu_slots still rules.
    nodes = [record("aa", "10.0.0.1", cpus=8), record("bb", "10.0.0.2", cpus=8)]
    infos = list(ray_nodes(nodes, local_node_id="aa", local_ip="10.0.0.1", cpu_slots=None,
                           local_cores=2))
    cluster = build(infos)
    assert [n.cpus for n in cluster.nodes] == [2, 8]
    assert [len(n.devices) for n in cluster.nodes] == [2, 8]
    oversubscribed = build(list(ray_nodes(nodes, local_node_id="aa", local_ip="10.0.0.1",
                                          cpu_slots=4, local_cores=2)))
    assert [n.cpus for n in oversubscribed.nodes] == [2, 8]
    assert [len(n.devices) for n in oversubscribed.nodes] == [4, 4]
    # Ray declaring fewer CPUs than cores keeps Ray's count (the ranks' reservations fit it).
    fewer = build(list(ray_nodes([record("aa", "10.0.0.1", cpus=1)], local_node_id="aa",
                                 local_ip="10.0.0.1", cpu_slots=None, local_cores=2)))
    assert fewer.nodes[0].cpus == 1
