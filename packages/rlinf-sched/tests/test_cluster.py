"""Cluster: uniform and file-described clusters, round trips, discovery on this machine."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from rlinf.sched import ClusterError
from rlinf.sched.cluster import Cluster, parse_bytes


def test_uniform_large_cluster() -> None:
    c = Cluster.uniform(128, 8, "80GiB", "H100")
    assert c.num_devices == 1024
    assert c.num_nodes == 128
    assert c.node_of(0) == 0
    assert c.node_of(7) == 0
    assert c.node_of(8) == 1
    assert c.node_of(1023) == 127
    assert c.devices[9].local_index == 1
    assert c.devices[0].memory_bytes == 80 * 2**30
    assert c.devices[0].is_gpu and c.has_gpus
    assert c.nodes[3].nvlink
    assert c.same_node(8, 15) and not c.same_node(7, 8)
    assert c.bandwidth(8, 15) == c.intra_node_bandwidth > c.bandwidth(7, 8)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_file_round_trip(tmp_path: Path, suffix: str) -> None:
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    c = Cluster.uniform(16, 8, 141 * 10**9, "H200", cpus_per_node=96, node_memory_bytes="1TiB")
    path = tmp_path / f"cluster{suffix}"
    c.to_file(path)
    again = Cluster.from_file(path)
    assert again == c
    assert again.nodes[15].cpus == 96
    assert again.nodes[15].memory_bytes == 2**40


def test_heterogeneous_file(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    path = tmp_path / "mixed.yaml"
    path.write_text(
        "name: mixed\n"
        "inter_node_bandwidth: 2.5e10\n"
        "nodes:\n"
        "  - {count: 2, devices: 8, device_kind: H100, device_memory: 80GiB, nvlink: true,\n"
        "     hostname: gpu}\n"
        "  - {devices: 4, device_kind: L4, device_memory: 24GB}\n"
        "  - {devices: 16, device_memory: 4GiB, cpus: 16}\n"
    )
    c = Cluster.from_file(path)
    assert c.name == "mixed"
    assert c.num_devices == 8 + 8 + 4 + 16
    assert [n.hostname for n in c.nodes] == ["gpu-0", "gpu-1", "node2", "node3"]
    assert c.node_of(19) == 2 and c.devices[19].kind == "L4"
    assert c.devices[19].memory_bytes == 24 * 10**9
    assert c.devices[-1].backend == "cpu" and not c.devices[-1].is_gpu
    assert c.inter_node_bandwidth == 2.5e10
    again_path = tmp_path / "again.json"
    c.to_file(again_path)
    assert Cluster.from_file(again_path) == c


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"nodes": []}, "no nodes"),
        ({}, "expected a mapping with a 'nodes' list"),
        ({"nodes": [{"devices": 8}]}, "needs 'devices' and 'device_memory'"),
        ({"nodes": [{"devices": 0, "device_memory": 1}]}, "nodes[0].devices is 0"),
        ({"nodes": [{"devices": 2, "device_memory": "80 parsecs"}]},
         "nodes[0].device_memory is '80 parsecs'"),
        ({"nodes": [{"devices": 2, "device_memory": 1, "gpus": 3}]}, "unknown key(s) ['gpus']"),
        ({"nodes": [{"devices": 2, "device_memory": 1, "backend": "tpu"}]}, "'cuda' or 'cpu'"),
        ({"nodes": [{"count": -1, "devices": 2, "device_memory": 1}]}, "nodes[0].count"),
    ],
)
def test_invalid_descriptions(data: dict, fragment: str) -> None:
    with pytest.raises(ClusterError) as info:
        Cluster.from_dict(data)
    assert fragment in str(info.value)


def test_invalid_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{nodes: ")
    with pytest.raises(ClusterError, match="not valid JSON"):
        Cluster.from_file(bad)
    with pytest.raises(ClusterError, match="cannot read cluster file"):
        Cluster.from_file(tmp_path / "missing.json")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"nodes": [{"devices": 1}]}))
    with pytest.raises(ClusterError, match=r"wrong\.json"):
        Cluster.from_file(wrong)


def test_node_of_out_of_range() -> None:
    with pytest.raises(ClusterError, match="device 16 is out of range"):
        Cluster.uniform(2, 8, 1).node_of(16)


def test_parse_bytes() -> None:
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("141GB") == 141 * 10**9
    assert parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes(1.5e9) == 1_500_000_000
    assert parse_bytes("1.5e3") == 1500
    with pytest.raises(ClusterError):
        parse_bytes(-1)


def test_discover_this_machine_without_ray() -> None:
    c = Cluster.discover(use_ray=False)
    assert c.num_nodes == 1
    assert c.num_devices >= 1
    if not c.has_gpus:  # a CPU box: one logical device per usable core
        assert c.num_devices == len(os.sched_getaffinity(0))
        assert all(d.backend == "cpu" and d.kind == "cpu" for d in c.devices)
        assert c.devices[0].memory_bytes > 0
    assert Cluster.from_dict(c.to_dict()) == c


def test_discover_oversubscribed_cpu_slots() -> None:
    c = Cluster.discover(use_ray=False, cpu_slots=8)
    if c.has_gpus:
        pytest.skip("GPUs present: cpu_slots applies to GPU-less nodes only")
    assert c.num_devices == 8
    assert {c.node_of(d) for d in range(8)} == {0}
    with pytest.raises(ClusterError, match="cpu_slots=0"):
        Cluster.discover(use_ray=False, cpu_slots=0)


@pytest.mark.slow
def test_discover_through_ray() -> None:
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        c = Cluster.discover()
        assert c.num_nodes == len([n for n in ray.nodes() if n["Alive"]])
        assert c.nodes[0].address == ray.util.get_node_ip_address()
        if not c.has_gpus:
            assert c.num_devices == 2  # the CPU resource Ray was given
    finally:
        if started:
            ray.shutdown()


def test_gpu_names_and_nvml_fallback() -> None:
    from rlinf.sched._discovery import local_gpus, short_gpu_name

    assert short_gpu_name("NVIDIA H100 80GB HBM3") == "H100"
    assert short_gpu_name("NVIDIA A100-SXM4-80GB") == "A100"
    assert short_gpu_name("NVIDIA GeForce RTX 4090") == "GeForce RTX 4090"
    assert short_gpu_name("Tesla T4") == "T4"
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        assert local_gpus() == []  # no driver: discovery falls back instead of failing
    else:
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        gpus = local_gpus()
        assert len(gpus) == count
        assert all(g.memory_bytes > 0 for g in gpus)
        assert Cluster.discover(use_ray=False).num_devices == count


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("intra_node_bandwidth", 0, "expected a finite number > 0"),
        ("intra_node_bandwidth", -1e9, "expected a finite number > 0"),
        ("intra_node_bandwidth", NAN, "expected a finite number > 0"),
        ("intra_node_bandwidth", INF, "expected a finite number > 0"),
        ("intra_node_bandwidth", "fast", "expected a finite number > 0"),
        ("inter_node_bandwidth", 0, "expected a finite number > 0"),
        ("inter_node_bandwidth", True, "expected a finite number > 0"),
        ("intra_node_latency", -1e-3, "expected a finite number >= 0"),
        ("inter_node_latency", NAN, "expected a finite number >= 0"),
        ("nodes[0].device_memory", 0, "expected a byte count > 0"),
        ("nodes[0].device_memory", "0GiB", "expected a byte count > 0"),
        ("nodes[0].device_memory", -1, "expected a byte count > 0"),
        ("nodes[0].device_memory", NAN, "expected a byte count > 0"),
        ("nodes[0].device_memory", "1e400GiB", "expected a byte count > 0"),
        ("nodes[0].device_memory", True, "expected a byte count > 0"),
        ("nodes[0].memory", -1, "expected a byte count >= 0"),
        ("nodes[0].memory", INF, "expected a byte count >= 0"),
        ("nodes[0].devices", 0, "expected an integer >= 1"),
        ("nodes[0].devices", 2.5, "expected an integer >= 1"),
        ("nodes[0].devices", True, "expected an integer >= 1"),
        ("nodes[0].count", 1.5, "expected an integer >= 1"),
        ("nodes[0].cpus", -1, "expected an integer >= 0"),
        ("nodes[0].nvlink", "yes", "expected true or false"),
    ],
)
def test_bad_values_in_a_cluster_file_are_refused_by_rlinf_plan(
    run_with_bad: Any, assert_refused: Any, key: str, value: object, expected: str
) -> None:
    def change(document: dict[str, Any]) -> None:
        if key.startswith("nodes[0]."):
            document["nodes"][0][key.removeprefix("nodes[0].")] = value
        else:
            document[key] = value

    assert_refused(run_with_bad("cluster", change), f"{key} is ", expected)


def test_a_misspelt_top_level_key_is_refused(run_with_bad: Any, assert_refused: Any) -> None:
    # A bandwidth under a misspelt name used to be ignored in favour of the default.
    result = run_with_bad("cluster", lambda d: d.update(intra_node_bandwith=1e9))
    assert_refused(result, "unknown key(s) ['intra_node_bandwith']", "expected")


def test_latencies_round_trip_through_files(tmp_path: Path) -> None:
    cluster = dataclasses.replace(Cluster.uniform(2, 2, "1GiB"), intra_node_latency=2e-5,
                                  inter_node_latency=1e-4)
    cluster.to_file(tmp_path / "c.json")
    back = Cluster.from_file(tmp_path / "c.json")
    assert (back.intra_node_latency, back.inter_node_latency) == (2e-5, 1e-4)
    assert back.latency(0, 1) == 2e-5 and back.latency(1, 2) == 1e-4
    with pytest.raises(ClusterError, match="intra_node_latency is -1"):
        dataclasses.replace(cluster, intra_node_latency=-1)


def test_constructed_clusters_refuse_bad_bandwidths() -> None:
    with pytest.raises(ClusterError, match="inter_node_bandwidth is 0"):
        Cluster.uniform(2, 1, "1GiB", inter_node_bandwidth=0)
    with pytest.raises(ClusterError, match="intra_node_bandwidth is nan"):
        Cluster.uniform(1, 2, "1GiB", intra_node_bandwidth=NAN)


def test_parse_bytes_names_its_key() -> None:
    with pytest.raises(ClusterError, match=r"^x\.mem is nan: expected a byte count >= 0"):
        parse_bytes(NAN, where="x.mem")
    assert parse_bytes("0", where="x.mem") == 0
    with pytest.raises(ClusterError, match="> 0"):
        parse_bytes("0", where="x.mem", positive=True)
