"""Probing this machine (nvidia-ml-py, /proc) and a running Ray cluster for `Cluster.discover`.

Everything optional is imported lazily and every failure falls back: no nvidia-ml-py or no
driver (``NVMLError``) means no GPUs here; Ray not imported or not initialized in this process
means a single-node cluster. Nodes found through Ray carry their Ray node id, so workers
can be pinned to the node that owns their devices.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from rlinf.sched.cluster import known_gpu_memory, local_hostname, usable_cpus

_log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class LocalGpu:
    """One GPU of this machine as nvidia-ml-py reports it."""

    name: str
    memory_bytes: int
    nvlink: bool


def host_memory_bytes() -> int:
    """Physical memory of this machine (0 if the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 0


def short_gpu_name(name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` → ``"H100"``: the model token the rest of the code uses."""
    for token in name.replace("NVIDIA", "").split():
        if any(c.isdigit() for c in token) and token[0].isalpha():
            return token.split("-")[0]
    return name.replace("NVIDIA", "").strip() or "gpu"


def local_gpus() -> list[LocalGpu]:
    """GPUs of this machine through nvidia-ml-py; empty without the module or a driver."""
    try:
        import pynvml
    except ImportError:
        _log.debug("nvml_unavailable", reason="nvidia-ml-py not installed")
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        _log.debug("nvml_unavailable", reason=str(exc))
        return []
    gpus: list[LocalGpu] = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            raw = pynvml.nvmlDeviceGetName(handle)
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            gpus.append(LocalGpu(short_gpu_name(name), memory, _has_nvlink(pynvml, handle)))
    except pynvml.NVMLError as exc:
        _log.warning("nvml_query_failed", error=str(exc), gpus_read=len(gpus))
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return gpus


def _has_nvlink(pynvml: Any, handle: Any) -> bool:
    links = getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)
    for link in range(links):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                return True
        except pynvml.NVMLError:
            return False
    return False


def _cpu_node(
    hostname: str, address: str, cpus: int, memory: int, slots: int,
    *, ray_node_id: str | None = None,
) -> dict[str, Any]:
    per_slot = memory // slots if memory else 0
    return {
        "hostname": hostname, "address": address, "devices": [("cpu", per_slot, "cpu")] * slots,
        "nvlink": False, "cpus": cpus, "memory_bytes": memory, "ray_node_id": ray_node_id,
    }


def _gpu_node(
    hostname: str, address: str, gpus: list[LocalGpu], cpus: int, memory: int,
    *, ray_node_id: str | None = None,
) -> dict[str, Any]:
    return {
        "hostname": hostname, "address": address,
        "devices": [(g.name, g.memory_bytes, "cuda") for g in gpus],
        "nvlink": any(g.nvlink for g in gpus), "cpus": cpus, "memory_bytes": memory,
        "ray_node_id": ray_node_id,
    }


def discover_nodes(*, use_ray: bool, cpu_slots: int | None,
                   gpus: bool = True) -> Iterator[dict[str, Any]]:
    """Keyword arguments for `_Builder.add_node`, one dict per node (``gpus=False``: every
    node as CPU slots, its GPUs not counted as devices)."""
    if cpu_slots is not None and cpu_slots < 1:
        from rlinf.sched.errors import ClusterError

        raise ClusterError(f"cpu_slots={cpu_slots}: expected at least one slot per node")
    ray = sys.modules.get("ray") if use_ray else None  # initialized Ray implies imported Ray
    if ray is not None and ray.is_initialized():
        yield from _ray_nodes(ray, cpu_slots, gpus)
        return
    hostname, cpus, memory = local_hostname(), usable_cpus(), host_memory_bytes()
    found = local_gpus() if gpus else []
    if found:
        yield _gpu_node(hostname, "", found, cpus, memory)
    else:
        yield _cpu_node(hostname, "", cpus, memory, cpu_slots or cpus)


RAYLET_PROBE_TIMEOUT_S = 2.0
"""How long discovery waits for another node's raylet to accept a connection."""


def _ray_nodes(ray: Any, cpu_slots: int | None, gpus: bool) -> Iterator[dict[str, Any]]:
    local_id = _local_node_id(ray)
    records = [n for n in ray.nodes()
               if n.get("Alive") and (n.get("NodeID") == local_id or _raylet_reachable(n))]
    yield from ray_nodes(records, local_node_id=local_id,
                         local_ip=ray.util.get_node_ip_address(), cpu_slots=cpu_slots,
                         gpus=gpus, local_cores=usable_cpus())


def _raylet_reachable(node: Mapping[str, Any]) -> bool:
    """Whether the node's raylet accepts a connection. Ray marks a node dead only after
    missing several heartbeats (seconds to tens of seconds); a run that restarts after
    losing a node must not plan on it meanwhile. A killed raylet refuses at once."""
    import socket

    address, port = node.get("NodeManagerAddress"), node.get("NodeManagerPort")
    if not address or not port:
        return True  # nothing to probe: trust Ray
    try:
        with socket.create_connection((str(address), int(port)),
                                      timeout=RAYLET_PROBE_TIMEOUT_S):
            return True
    except OSError as exc:
        _log.warning("ray_node_unreachable", node_id=node.get("NodeID"), address=address,
                     port=port, error=str(exc))
        return False


def _local_node_id(ray: Any) -> str:
    """The Ray node id of this process ("" if Ray cannot say)."""
    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception as exc:  # a driver always has one; never fail discovery over it
        _log.debug("ray_node_id_unavailable", error=str(exc))
        return ""


def ray_nodes(
    nodes: Sequence[Mapping[str, Any]], *, local_node_id: str, local_ip: str,
    cpu_slots: int | None, gpus: bool = True, local_cores: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Nodes from ``ray.nodes()`` records: alive ones only, this process's node first (by
    node id, else by IP: several Ray nodes may share one machine's IP), then by address and
    node id; each carries its ``ray_node_id``. GPUs of the local node come from nvidia-ml-py;
    ``gpus=False`` makes every node CPU slots.

    A node's cores are Ray's ``CPU`` resource, except that the local node's are at most
    `local_cores` (the cores this process may run on): Ray's count is whatever ``ray start
    --num-cpus`` declared, and a 2-core machine declared as 8 CPUs would otherwise get 8 slots
    by default and be priced as 8 cores that never contend.
    """
    alive = [n for n in nodes if n.get("Alive")]
    local = next((n for n in alive if local_node_id and n.get("NodeID") == local_node_id),
                 next((n for n in alive if n.get("NodeManagerAddress") == local_ip), None))
    alive.sort(key=lambda n: (n is not local, str(n.get("NodeManagerAddress", "")),
                              str(n.get("NodeID", ""))))
    for node in alive:
        res = node.get("Resources", {})
        address = str(node.get("NodeManagerAddress", ""))
        hostname = str(node.get("NodeManagerHostname", address))
        node_id = str(node["NodeID"]) if node.get("NodeID") else None
        cpus = int(res.get("CPU", 0))
        if node is local and local_cores and cpus > local_cores:
            _log.info("ray_cpus_above_cores", ray_cpus=cpus, cores=local_cores)
            cpus = local_cores
        memory = int(res.get("memory", 0))
        num_gpus = int(res.get("GPU", 0)) if gpus else 0
        if node is local and gpus:
            found = local_gpus()
            if found:
                yield _gpu_node(hostname, address, found[: num_gpus or len(found)], cpus,
                                memory, ray_node_id=node_id)
                continue
        if num_gpus:
            kinds = [k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")]
            kind = kinds[0] if kinds else "gpu"
            mem = known_gpu_memory(kind) or 0
            yield _gpu_node(hostname, address, [LocalGpu(kind, mem, False)] * num_gpus, cpus,
                            memory, ray_node_id=node_id)
        else:
            yield _cpu_node(hostname, address, cpus, memory, cpu_slots or max(cpus, 1),
                            ray_node_id=node_id)
