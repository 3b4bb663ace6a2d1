"""The cluster: nodes and their accelerators, discovered or described in a file.

Devices have global indices ``0..num_devices-1`` numbered node by node; placements refer to
these indices. Three ways to get a `Cluster`:

- `Cluster.discover()` — this machine (and, when Ray is initialized, every alive Ray node,
  each `Node` carrying its Ray node id so ranks can be pinned to it).
  GPUs come from nvidia-ml-py (model, memory, NVLink) on the local node and from Ray's
  ``GPU``/``accelerator_type:*`` resources on others. A node without GPUs offers logical CPU
  devices, one per CPU core slot, so every execution mode runs for real on a CPU box.
- `Cluster.uniform(num_nodes, devices_per_node, device_memory_bytes, kind)` — a homogeneous
  cluster, e.g. 128 nodes × 8 H100, for planning hardware we do not have.
- `Cluster.from_file(path)` — a JSON or YAML description (YAML needs PyYAML). Schema::

      name: h100-pod                 # optional
      intra_node_bandwidth: 4.5e11   # optional, bytes/s between devices of one node
      inter_node_bandwidth: 5.0e10   # optional, bytes/s between nodes
      intra_node_latency: 2.0e-5     # optional (0), seconds per message within a node
      inter_node_latency: 1.0e-4     # optional (0), seconds per message between nodes
      message_latency: 1.0e-3        # optional (0), seconds every message between two
                                     # components' processes costs, on the same devices too
      turn_latency: 1.0e-2           # optional (0), seconds a device idles when its turn
                                     # passes to another component (the device lock)
      cpu_background: 0.5            # optional (0), cores' worth of CPU the runtime itself
                                     # uses on a node of CPU slots (`rlinf.sched.core_sharing`)
      nodes:                         # required, a list; entries expand in order
        - count: 128                 # optional (1): this many identical nodes
          devices: 8                 # required: accelerators (or CPU slots) per node
          device_kind: H100          # optional ("cpu"): accelerator model
          device_memory: 80GiB       # required: bytes per device, int or "80GiB"/"80GB"/"512MiB"
          backend: cuda              # optional: "cuda" or "cpu" (default from device_kind)
          nvlink: true               # optional (false): devices of the node share NVLink
          cpus: 192                  # optional (0 = unknown): CPU cores of the node
          memory: 2TiB               # optional (0 = unknown): host memory
          hostname: node             # optional: a name, or a prefix when count > 1

  `Cluster.to_dict()`/`to_file()` write the same schema, so files round-trip.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from rlinf.sched._files import load_mapping, read_bool, read_int, read_number
from rlinf.sched.errors import ClusterError

__all__ = ["Cluster", "Device", "Node", "parse_bytes"]

_log = structlog.get_logger(__name__)

DEFAULT_INTRA_NODE_BANDWIDTH = 4.5e11  # bytes/s, NVLink 4 class
DEFAULT_INTER_NODE_BANDWIDTH = 5.0e10  # bytes/s, 400 Gb/s NIC
_CPU_INTRA_NODE_BANDWIDTH = 1.0e10  # bytes/s, shared-memory copy on a small box

# Memory of accelerators Ray reports only by model name (accelerator_type:<model>).
_KNOWN_GPU_MEMORY = {
    "H200": 141 * 10**9,
    "H100": 80 * 2**30,
    "H800": 80 * 2**30,
    "A100": 80 * 2**30,
    "A100-40G": 40 * 2**30,
    "A100-80G": 80 * 2**30,
    "A800": 80 * 2**30,
    "L40S": 48 * 2**30,
    "L4": 24 * 2**30,
    "A10G": 24 * 2**30,
    "V100": 32 * 2**30,
    "T4": 16 * 2**30,
}

_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
_BYTES_RE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*")


def parse_bytes(value: int | float | str, *, where: str = "byte count",
                positive: bool = False) -> int:
    """Read a byte count: an int, or a string such as ``"80GiB"``, ``"141GB"``, ``"512 MiB"``.

    ClusterError names `where` (e.g. ``nodes[0].device_memory``) for anything but a finite
    count >= 0 (> 0 with `positive`).
    """
    bound = "> 0" if positive else ">= 0"
    expected = (f"expected a byte count {bound}: a number with an optional unit "
                f"({', '.join(u for u in _UNITS if u)}), e.g. '80GiB'")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ClusterError(f"{where} is {value!r}: {expected}")
    if isinstance(value, str):
        m = _BYTES_RE.fullmatch(value)
        unit = m.group(2).upper() if m else ""
        if m is None or unit not in _UNITS:
            raise ClusterError(f"{where} is {value!r}: {expected}")
        number = float(m.group(1)) * _UNITS[unit]
    else:
        number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and int(number) == 0):
        raise ClusterError(f"{where} is {value!r}: {expected}")
    return int(number)


@dataclass(frozen=True)
class Device:
    """One accelerator, or one CPU core slot standing in for one."""

    index: int
    """Global index, used by placements."""
    node: int
    """Index of the node that holds it."""
    local_index: int
    """Index on its node (CUDA device ordinal for GPUs)."""
    kind: str
    """Model, e.g. ``"H100"``, or ``"cpu"`` for a logical CPU device."""
    memory_bytes: int
    """Memory of the device (for CPU slots: the node's memory divided among its slots)."""
    backend: str = "cuda"
    """``"cuda"`` or ``"cpu"``."""

    @property
    def is_gpu(self) -> bool:
        """True for a CUDA accelerator, False for a logical CPU device."""
        return self.backend == "cuda"


@dataclass(frozen=True)
class Node:
    """One machine of the cluster."""

    index: int
    """Node index, in discovery or file order."""
    hostname: str
    """Host name (or a made-up one for described clusters)."""
    devices: tuple[int, ...]
    """Global indices of its devices."""
    nvlink: bool = False
    """Whether its GPUs are connected by NVLink."""
    cpus: int = 0
    """CPU cores (0 if unknown)."""
    memory_bytes: int = 0
    """Host memory in bytes (0 if unknown)."""
    address: str = ""
    """IP address where known (Ray's node manager address)."""
    ray_node_id: str | None = None
    """Ray node id (hex) of a node discovered from a live Ray cluster; None for clusters
    built from a description (`from_dict`, `from_file`, `uniform`) or without Ray. Ranks
    placed on this node's devices are pinned to it; not written by `to_dict` (it names one
    Ray session only)."""


@dataclass(frozen=True)
class Cluster:
    """Nodes and devices; built by `discover`, `uniform`, `from_file` or `from_dict`."""

    nodes: tuple[Node, ...]
    devices: tuple[Device, ...]
    name: str = ""
    intra_node_bandwidth: float = DEFAULT_INTRA_NODE_BANDWIDTH
    """Bytes/s between two devices of one node."""
    inter_node_bandwidth: float = DEFAULT_INTER_NODE_BANDWIDTH
    """Bytes/s between devices on different nodes."""
    intra_node_latency: float = 0.0
    """Seconds every message between two devices of one node costs besides its bytes (what
    a link's round trip measures at zero size: process wake-ups, the transport's calls)."""
    inter_node_latency: float = 0.0
    """Seconds per message between devices on different nodes."""
    message_latency: float = 0.0
    """Seconds every message between two components' processes costs besides its transfer,
    also between components on the same devices (the consumer's wake-up, the channel's put
    and get): a measured quantity (the reasoning app fits it to a pipelined probe)."""
    cpu_background: float = 0.0
    """Cores' worth of CPU that the runtime's own processes (driver, Ray, channel transfers)
    take on each node of CPU slots while components compute beside each other; a measured
    quantity (`rlinf.sched.core_sharing` explains the model)."""
    turn_latency: float = 0.0
    """Seconds a device set stays idle each time a component starts a call on it after
    another component's call, or starts the iteration's first call on it: the device lock's
    release and grant, the new holder's wake-up and taking its input, the driver's dispatch.
    A measured quantity (`rlinf.workers.flow.auto.calibrated_cluster` fits it to the collocated
    probes, where components take turns on every device)."""
    _node_of: tuple[int, ...] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.devices:
            raise ClusterError("a cluster needs at least one device: expected a non-empty list")
        for label in ("intra_node_bandwidth", "inter_node_bandwidth"):
            read_number(getattr(self, label), label, error=ClusterError, positive=True)
        for label in ("intra_node_latency", "inter_node_latency", "message_latency",
                      "cpu_background", "turn_latency"):
            read_number(getattr(self, label), label, error=ClusterError)
        for i, dev in enumerate(self.devices):
            if dev.index != i:
                raise ClusterError(
                    f"device at position {i} has index {dev.index}: expected devices numbered "
                    "0..n-1 in order"
                )
            if not 0 <= dev.node < len(self.nodes) or dev.index not in self.nodes[dev.node].devices:
                raise ClusterError(
                    f"device {dev.index} claims node {dev.node}, which does not list it"
                )
        for i, node in enumerate(self.nodes):
            if node.index != i:
                raise ClusterError(f"node at position {i} has index {node.index}: expected {i}")
        object.__setattr__(self, "_node_of", tuple(d.node for d in self.devices))

    # ---------------------------------------------------------------- queries
    @property
    def num_devices(self) -> int:
        """Total devices (GPUs, or CPU slots on a GPU-less node)."""
        return len(self.devices)

    def device_memory(self) -> dict[int, int]:
        """Memory of each device by global index, where it is known (> 0): what the device
        lock's switch rule (`DeviceLockServer(device_memory=)`) fits components into."""
        return {d.index: d.memory_bytes for d in self.devices if d.memory_bytes > 0}

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        return len(self.nodes)

    @property
    def has_gpus(self) -> bool:
        """True if any device is a CUDA accelerator."""
        return any(d.is_gpu for d in self.devices)

    def node_of(self, device: int) -> int:
        """Index of the node that holds global device `device`."""
        if not 0 <= device < len(self._node_of):
            raise ClusterError(
                f"device {device} is out of range: expected 0-{self.num_devices - 1}"
            )
        return self._node_of[device]

    def same_node(self, a: int, b: int) -> bool:
        """Whether devices `a` and `b` are on the same node."""
        return self.node_of(a) == self.node_of(b)

    def bandwidth(self, a: int, b: int) -> float:
        """Bytes/s for moving data from device `a` to device `b` (infinite within a device)."""
        if a == b:
            return float("inf")
        return self.intra_node_bandwidth if self.same_node(a, b) else self.inter_node_bandwidth

    def latency(self, a: int, b: int) -> float:
        """Seconds per message from device `a` to device `b` (0 within a device)."""
        if a == b:
            return 0.0
        return self.intra_node_latency if self.same_node(a, b) else self.inter_node_latency

    # ---------------------------------------------------------------- constructors
    @classmethod
    def uniform(
        cls,
        num_nodes: int,
        devices_per_node: int,
        device_memory_bytes: int | str,
        kind: str = "H100",
        *,
        nvlink: bool | None = None,
        cpus_per_node: int = 0,
        node_memory_bytes: int | str = 0,
        name: str = "",
        intra_node_bandwidth: float | None = None,
        inter_node_bandwidth: float = DEFAULT_INTER_NODE_BANDWIDTH,
    ) -> Cluster:
        """A homogeneous cluster of `num_nodes` × `devices_per_node` devices of one `kind`."""
        if num_nodes < 1 or devices_per_node < 1:
            raise ClusterError(
                f"uniform cluster of {num_nodes} node(s) × {devices_per_node} device(s): "
                "expected at least one of each"
            )
        spec = {
            "count": num_nodes,
            "devices": devices_per_node,
            "device_kind": kind,
            "device_memory": device_memory_bytes,
            "nvlink": (kind.lower() != "cpu") if nvlink is None else nvlink,
            "cpus": cpus_per_node,
            "memory": node_memory_bytes,
        }
        data: dict[str, Any] = {"name": name, "nodes": [spec]}
        data["inter_node_bandwidth"] = inter_node_bandwidth
        if intra_node_bandwidth is not None:
            data["intra_node_bandwidth"] = intra_node_bandwidth
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Cluster:
        """Build a cluster from the file schema in the module docstring."""
        if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list):
            raise ClusterError(
                f"cluster description {_short(data)}: expected a mapping with a 'nodes' list"
            )
        unknown = set(data) - _CLUSTER_KEYS
        if unknown:
            raise ClusterError(
                f"unknown key(s) {sorted(unknown)}: expected {sorted(_CLUSTER_KEYS)}"
            )
        builder = _Builder()
        any_gpu = False
        for n, entry in enumerate(data["nodes"]):
            where = f"nodes[{n}]"
            if not isinstance(entry, Mapping):
                raise ClusterError(f"{where} is {_short(entry)}: expected a mapping")
            unknown = set(entry) - _NODE_KEYS
            if unknown:
                raise ClusterError(
                    f"{where} has unknown key(s) {sorted(unknown)}: expected {sorted(_NODE_KEYS)}"
                )
            if "devices" not in entry or "device_memory" not in entry:
                raise ClusterError(f"{where} needs 'devices' and 'device_memory'")
            count = read_int(entry.get("count", 1), f"{where}.count", error=ClusterError)
            devices = read_int(entry["devices"], f"{where}.devices", error=ClusterError)
            memory = parse_bytes(entry["device_memory"], where=f"{where}.device_memory",
                                 positive=True)
            nvlink = read_bool(entry.get("nvlink", False), f"{where}.nvlink", error=ClusterError)
            cpus = read_int(entry.get("cpus", 0), f"{where}.cpus", error=ClusterError, minimum=0)
            host_memory = parse_bytes(entry.get("memory", 0), where=f"{where}.memory")
            kind = str(entry.get("device_kind", "cpu"))
            backend = str(entry.get("backend", "cpu" if kind.lower() == "cpu" else "cuda"))
            if backend not in ("cuda", "cpu"):
                raise ClusterError(f"{where}.backend is {backend!r}: expected 'cuda' or 'cpu'")
            any_gpu |= backend == "cuda"
            hostname = entry.get("hostname")
            for k in range(count):
                host = (
                    str(hostname) if hostname is not None and count == 1
                    else f"{hostname}-{k}" if hostname is not None
                    else f"node{len(builder.nodes)}"
                )
                builder.add_node(
                    hostname=host,
                    address=str(entry.get("address", "")),
                    devices=[(kind, memory, backend)] * devices,
                    nvlink=nvlink,
                    cpus=cpus,
                    memory_bytes=host_memory,
                )
        if not builder.nodes:
            raise ClusterError("cluster description has no nodes: expected at least one")
        intra_default = DEFAULT_INTRA_NODE_BANDWIDTH if any_gpu else _CPU_INTRA_NODE_BANDWIDTH
        return builder.build(
            name=str(data.get("name", "")),
            intra_node_bandwidth=read_number(
                data.get("intra_node_bandwidth", intra_default), "intra_node_bandwidth",
                error=ClusterError, positive=True),
            inter_node_bandwidth=read_number(
                data.get("inter_node_bandwidth", DEFAULT_INTER_NODE_BANDWIDTH),
                "inter_node_bandwidth", error=ClusterError, positive=True),
            intra_node_latency=read_number(data.get("intra_node_latency", 0.0),
                                           "intra_node_latency", error=ClusterError),
            inter_node_latency=read_number(data.get("inter_node_latency", 0.0),
                                           "inter_node_latency", error=ClusterError),
            message_latency=read_number(data.get("message_latency", 0.0), "message_latency",
                                        error=ClusterError),
            cpu_background=read_number(data.get("cpu_background", 0.0), "cpu_background",
                                       error=ClusterError),
            turn_latency=read_number(data.get("turn_latency", 0.0), "turn_latency",
                                     error=ClusterError),
        )

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Cluster:
        """Read a JSON (``.json``) or YAML (``.yaml``/``.yml``) cluster description."""
        data = load_mapping(path, error=ClusterError, what="cluster")
        try:
            return cls.from_dict(data)
        except ClusterError as exc:
            raise ClusterError(f"in cluster file {str(path)!r}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """The file schema, with consecutive identical nodes folded into one `count` entry."""
        entries: list[dict[str, Any]] = []
        for node in self.nodes:
            devs = [self.devices[i] for i in node.devices]
            kinds = {(d.kind, d.memory_bytes, d.backend) for d in devs}
            if len(kinds) != 1:
                raise ClusterError(
                    f"node {node.index} mixes device kinds {sorted(kinds)}: the file schema "
                    "describes one kind per node"
                )
            kind, memory, backend = kinds.pop()
            entry: dict[str, Any] = {
                "count": 1,
                "devices": len(devs),
                "device_kind": kind,
                "device_memory": memory,
                "backend": backend,
                "nvlink": node.nvlink,
                "cpus": node.cpus,
                "memory": node.memory_bytes,
            }
            default_host = node.hostname == f"node{node.index}"
            if not default_host:
                entry["hostname"] = node.hostname
            if node.address:
                entry["address"] = node.address
            if entries and default_host and "hostname" not in entries[-1] and all(
                entries[-1][k] == v for k, v in entry.items() if k != "count"
            ) and "address" not in entry:
                entries[-1]["count"] += 1
            else:
                entries.append(entry)
        return {
            "name": self.name,
            "intra_node_bandwidth": self.intra_node_bandwidth,
            "inter_node_bandwidth": self.inter_node_bandwidth,
            "intra_node_latency": self.intra_node_latency,
            "inter_node_latency": self.inter_node_latency,
            **({"message_latency": self.message_latency} if self.message_latency else {}),
            **({"cpu_background": self.cpu_background} if self.cpu_background else {}),
            **({"turn_latency": self.turn_latency} if self.turn_latency else {}),
            "nodes": entries,
        }

    def to_file(self, path: str | os.PathLike[str]) -> None:
        """Write the description as JSON (or YAML for a ``.yaml``/``.yml`` path)."""
        p = Path(path)
        data = self.to_dict()
        if p.suffix.lower() in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as exc:
                raise ClusterError(
                    "writing YAML needs PyYAML: `pip install 'rlinf-sched[yaml]'`"
                ) from exc
            p.write_text(yaml.safe_dump(data, sort_keys=False))
        else:
            p.write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def discover(cls, *, use_ray: bool = True, cpu_slots: int | None = None,
                 gpus: bool = True) -> Cluster:
        """Discover the cluster this process runs in.

        With `use_ray` and Ray already initialized in this process (this never starts Ray),
        every alive Ray node is a node (this process's node first, then the others by
        address and node id), carrying its `Node.ray_node_id`; otherwise only this machine.
        GPUs of this machine are
        read through nvidia-ml-py, those of other nodes from Ray's resources. A node without
        GPUs gets `cpu_slots` logical CPU devices (default: its usable CPU cores; pass more to
        oversubscribe a small box, e.g. 8 to try an 8-device placement on 2 cores). With
        ``gpus=False`` every node is CPU slots: for workflows whose placement devices are
        processes on cores while GPUs are shared through Ray (rlinf-embodied with a CUDA
        policy).
        """
        from rlinf.sched._discovery import discover_nodes

        builder = _Builder()
        for info in discover_nodes(use_ray=use_ray, cpu_slots=cpu_slots, gpus=gpus):
            builder.add_node(**info)
        cluster = builder.build(
            name="discovered",
            intra_node_bandwidth=(
                DEFAULT_INTRA_NODE_BANDWIDTH if any(
                    b == "cuda" for n in builder.nodes for (_, _, b) in n["devices"]
                ) else _CPU_INTRA_NODE_BANDWIDTH
            ),
            inter_node_bandwidth=DEFAULT_INTER_NODE_BANDWIDTH,
        )
        _log.info(
            "cluster_discovered", nodes=cluster.num_nodes, devices=cluster.num_devices,
            gpus=cluster.has_gpus,
        )
        return cluster


_CLUSTER_KEYS = frozenset({"name", "intra_node_bandwidth", "inter_node_bandwidth",
                           "intra_node_latency", "inter_node_latency", "message_latency",
                           "cpu_background", "turn_latency", "nodes"})
_NODE_KEYS = frozenset(
    {"count", "devices", "device_kind", "device_memory", "backend", "nvlink", "cpus", "memory",
     "hostname", "address"}
)


class _Builder:
    """Numbers nodes and devices in order while a cluster is assembled."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []

    def add_node(
        self,
        *,
        hostname: str,
        devices: Sequence[tuple[str, int, str]],
        nvlink: bool = False,
        cpus: int = 0,
        memory_bytes: int = 0,
        address: str = "",
        ray_node_id: str | None = None,
    ) -> None:
        self.nodes.append({
            "hostname": hostname, "devices": list(devices), "nvlink": nvlink, "cpus": cpus,
            "memory_bytes": memory_bytes, "address": address, "ray_node_id": ray_node_id,
        })

    def build(
        self, *, name: str, intra_node_bandwidth: float, inter_node_bandwidth: float,
        intra_node_latency: float = 0.0, inter_node_latency: float = 0.0,
        message_latency: float = 0.0, cpu_background: float = 0.0, turn_latency: float = 0.0,
    ) -> Cluster:
        nodes: list[Node] = []
        devices: list[Device] = []
        for n, info in enumerate(self.nodes):
            indices = []
            for local, (kind, memory, backend) in enumerate(info["devices"]):
                indices.append(len(devices))
                devices.append(Device(len(devices), n, local, kind, memory, backend))
            nodes.append(Node(
                n, info["hostname"], tuple(indices), info["nvlink"], info["cpus"],
                info["memory_bytes"], info["address"], info["ray_node_id"],
            ))
        return Cluster(
            tuple(nodes), tuple(devices), name, intra_node_bandwidth, inter_node_bandwidth,
            intra_node_latency, inter_node_latency, message_latency, cpu_background,
            turn_latency,
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def known_gpu_memory(kind: str) -> int | None:
    """Memory of a GPU model Ray names in ``accelerator_type:<kind>``, if we know it."""
    return _KNOWN_GPU_MEMORY.get(kind.upper())


def local_hostname() -> str:
    """This machine's host name."""
    return socket.gethostname()


def usable_cpus() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
