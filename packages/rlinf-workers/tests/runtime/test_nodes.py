"""Rank → Ray node mapping and same-node checks, without a Ray cluster."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlinf.sched.cluster import Cluster
from rlinf.sched.placement import ComponentPlacement
from rlinf.workers.errors import ConfigError
from rlinf.workers.runtime import WorkerInfo, on_one_node, rank_node_ids, same_node
from rlinf.workers.runtime.nodes import check_node_capacity

A, B, C = "a" * 56, "b" * 56, "c" * 56  # Ray node ids are 56 hex characters


def discovered(*ids: str, devices: int = 2) -> Cluster:
    """A CPU cluster of `devices` slots per node, as discovery on a live Ray builds it."""
    base = Cluster.uniform(len(ids), devices, "1GiB", "cpu")
    nodes = tuple(replace(node, ray_node_id=node_id, address=f"10.0.0.{node.index + 1}")
                  for node, node_id in zip(base.nodes, ids, strict=True))
    return replace(base, nodes=nodes)


def alive(*ids: str) -> dict[str, str]:
    return {node_id: f"10.0.0.{i + 1}" for i, node_id in enumerate(ids)}


def test_each_rank_maps_to_the_node_owning_its_device() -> None:
    cluster = discovered(A, B)  # devices 0-1 on A, 2-3 on B
    spanning = ComponentPlacement("actor", (1, 2, 3))
    assert rank_node_ids(spanning, cluster, alive=alive(A, B)) == (A, B, B)
    # several processes per device: ranks fill a device's processes first
    shared = ComponentPlacement("rollout", (0, 3), procs_per_device=2)
    assert rank_node_ids(shared, cluster, alive=alive(A, B)) == (A, A, B, B)


def test_described_cluster_pins_nothing() -> None:
    cluster = Cluster.from_dict({"nodes": [{"count": 2, "devices": 1, "device_memory": "1GiB"}]})
    assert all(node.ray_node_id is None for node in cluster.nodes)
    # no node ids: no pinning, whatever the placement (also beyond the described devices)
    assert rank_node_ids(ComponentPlacement("x", (0, 7)), cluster, alive=alive(A)) is None


def test_device_beyond_the_cluster_names_device_and_nodes() -> None:
    cluster = discovered(A, B)
    with pytest.raises(ConfigError) as err:
        rank_node_ids(ComponentPlacement("actor", (2, 5)), cluster, alive=alive(A, B))
    text = str(err.value)
    assert "rank 1 on device 5" in text
    assert "devices 0-1" in text and "devices 2-3" in text  # what is available
    assert A[:12] in text and B[:12] in text


def test_device_on_a_node_that_left_ray_fails() -> None:
    cluster = discovered(A, B, C)
    with pytest.raises(ConfigError, match=r"rank 0 on device 4 of node 2 .*not alive") as err:
        rank_node_ids(ComponentPlacement("env", (4,)), cluster, alive=alive(A, B))
    assert "Ray's alive nodes are" in str(err.value)
    # devices on live nodes still map
    assert rank_node_ids(ComponentPlacement("env", (0, 3)), cluster, alive=alive(A, B)) == (A, B)


def test_partly_identified_cluster_is_refused() -> None:
    cluster = discovered(A, B)
    half = replace(cluster, nodes=(cluster.nodes[0], replace(cluster.nodes[1], ray_node_id=None)))
    with pytest.raises(ConfigError, match=r"not for node\(s\) \[1\]"):
        rank_node_ids(ComponentPlacement("x", (0,)), half, alive=alive(A, B))


def test_node_capacity() -> None:
    totals = {A: {"CPU": 2.0}, B: {"CPU": 1.0, "GPU": 1.0}}
    check_node_capacity("x", (A, A, B), per_rank={"CPU": 1.0, "GPU": 0.0}, totals=totals)
    with pytest.raises(ConfigError, match=r"2 rank\(s\) x 1 CPU on Ray node bbbbbbbbbbbb, "
                                          r"which has 1 CPU in total"):
        check_node_capacity("x", (A, B, B), per_rank={"CPU": 1.0}, totals=totals)
    with pytest.raises(ConfigError, match="GPU on Ray node aaaa"):
        check_node_capacity("x", (A,), per_rank={"CPU": 0.5, "GPU": 0.5}, totals=totals)


def test_same_node_from_reported_node_ids() -> None:
    a0, a1 = WorkerInfo(0, "10.0.0.1", A, 11), WorkerInfo(1, "10.0.0.1", A, 12)
    b0 = WorkerInfo(0, "10.0.0.1", B, 13)  # same IP, other Ray node: not the same node
    assert same_node(a0, a1)
    assert not same_node(a0, b0)
    assert on_one_node([a0, a1])
    assert not on_one_node([a0, a1, b0])
    assert on_one_node([])
