"""Where a process lives: host, process id and visible GPUs.

Two processes share a node when their ``host_id`` matches. The id combines the host
name with the kernel's boot id, so two containers that share a host name but not a
kernel (or two boots of one machine) never look alike, and with the node's identity when
one is known: the environment variable ``RLINF_NODE_ID`` if set, else the Ray node id of a
process connected to Ray. Two Ray nodes started on one machine (a test cluster) are then
two nodes, as they would be on separate machines; a process joins its Ray node's identity
once connected, so create endpoints after ``ray.init()``. GPUs are named by UUID, not by
index: ``CUDA_VISIBLE_DEVICES`` renumbers devices per process, UUIDs do not.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "HOST_ENV", "NODE_ID_ENV", "Locality", "default_listen_host", "local_gpu_uuids",
    "node_identity", "process_stamp", "stamped_process_gone",
]

NODE_ID_ENV = "RLINF_NODE_ID"
"""Environment variable naming this process's node explicitly (overrides Ray's node id)."""
HOST_ENV = "RLINF_COMM_HOST"
"""Environment variable naming the address this process's endpoints listen on."""


def _connected_ray() -> Any:
    """The `ray` module if this process imported and initialized it, else None."""
    ray = sys.modules.get("ray")
    try:
        return ray if ray is not None and ray.is_initialized() else None
    except Exception:  # a half-initialized or shutting-down Ray counts as not connected
        return None


def default_listen_host() -> str:
    """Where endpoints listen when not told: `HOST_ENV`, else this node's IP as Ray knows it
    (reachable from the other nodes of the Ray cluster), else ``127.0.0.1``."""
    explicit = os.environ.get(HOST_ENV, "").strip()
    if explicit:
        return explicit
    ray = _connected_ray()
    if ray is not None:
        try:
            return str(ray.util.get_node_ip_address())
        except Exception:  # no address known: stay on loopback (single node)
            return "127.0.0.1"
    return "127.0.0.1"


def node_identity() -> str:
    """This process's node beyond its host: `NODE_ID_ENV`, else the Ray node id, else "".

    Ray is consulted only when this process already imported and initialized it (never
    imported here).
    """
    explicit = os.environ.get(NODE_ID_ENV, "").strip()
    if explicit:
        return explicit
    ray = _connected_ray()
    if ray is None:
        return ""
    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # a shutting-down Ray has no usable node id
        return ""


def _host_id() -> str:
    boot = ""
    with contextlib.suppress(OSError):
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    host = f"{socket.gethostname()}/{boot}" if boot else socket.gethostname()
    node = node_identity()
    return f"{host}/node:{node}" if node else host


@functools.cache
def _kernel_and_pid_namespace() -> str:
    """This kernel boot and pid namespace: pids compare only within one; "" where unknown."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot}/{namespace}"


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), None if it does not exist.

    A pid is reused once its process is gone; the pair (pid, start) never is.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[19])


def process_stamp() -> dict[str, Any]:
    """What identifies this process for `stamped_process_gone`, JSON-safe."""
    return {"namespace": _kernel_and_pid_namespace(), "pid": os.getpid(),
            "started": _start_ticks(os.getpid())}


def stamped_process_gone(stamp: Any) -> bool:
    """Whether the process `stamp` (a `process_stamp`) provably no longer exists.

    Provable only from the same kernel and pid namespace: the pid is free, or another
    process took it since. Anything else (another node, a malformed stamp) is not proof.
    """
    if not isinstance(stamp, dict):
        return False
    namespace, pid, started = stamp.get("namespace"), stamp.get("pid"), stamp.get("started")
    here = _kernel_and_pid_namespace()
    if not here or namespace != here or not isinstance(pid, int) or not isinstance(started, int):
        return False
    return _start_ticks(pid) != started


def local_gpu_uuids() -> tuple[str, ...]:
    """UUIDs of the GPUs this process can use, in its own index order; () without any.

    Asks NVML (``rlinf-comm[cuda]``) and falls back on torch when torch is already
    imported; never imports torch itself (that costs seconds and GPU memory).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return ()
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver, no GPU: all mean "no GPUs here"
        return _torch_gpu_uuids()
    try:
        count = pynvml.nvmlDeviceGetCount()
        uuids = []
        for i in range(count):
            raw = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            uuids.append(raw.decode() if isinstance(raw, bytes) else str(raw))
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    if visible is None:
        return tuple(uuids)
    chosen = []
    for raw in visible.split(","):
        item = raw.strip()
        if item.isdigit() and int(item) < len(uuids):
            chosen.append(uuids[int(item)])
        elif item.startswith("GPU-"):
            chosen.extend(u for u in uuids if u.startswith(item))
    return tuple(chosen)


def _torch_gpu_uuids() -> tuple[str, ...]:
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    try:
        if not torch.cuda.is_available():
            return ()
        return tuple(f"GPU-{torch.cuda.get_device_properties(i).uuid}"
                     for i in range(torch.cuda.device_count()))
    except Exception:  # a broken CUDA setup means no usable GPU
        return ()


@dataclass(frozen=True)
class Locality:
    """Host, process and GPUs of one communicating process (JSON-safe via `to_dict`)."""

    host_id: str
    pid: int
    gpu_uuids: tuple[str, ...] = field(default=())

    @classmethod
    def current(cls, *, probe_gpus: bool = True) -> Locality:
        """This process's locality (GPU probing via NVML, skipped with probe_gpus=False)."""
        uuids = local_gpu_uuids() if probe_gpus else ()
        return cls(_host_id(), os.getpid(), uuids)

    def same_node(self, other: Locality) -> bool:
        return self.host_id == other.host_id

    def same_process(self, other: Locality) -> bool:
        return self.same_node(other) and self.pid == other.pid

    def elsewhere_on_node(self) -> Locality:
        """A stand-in for "another process on this node" (pid -1, same GPUs)."""
        return replace(self, pid=-1)

    def to_dict(self) -> dict[str, Any]:
        return {"host_id": self.host_id, "pid": self.pid, "gpu_uuids": list(self.gpu_uuids)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Locality:
        return cls(str(data["host_id"]), int(data["pid"]),
                   tuple(str(u) for u in data.get("gpu_uuids", ())))
