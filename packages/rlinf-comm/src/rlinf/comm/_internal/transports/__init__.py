"""Transports and the rule that picks one from where the two ends live.

=============  ===========================================  ==========================
name           when                                         how
=============  ===========================================  ==========================
``inproc``     same process                                 hand over the reference
``shm``        same node, host data                         Arrow IPC in POSIX shm
``cuda_ipc``   same node, GPU data                          CUDA IPC memory handles
``nccl``       other node, GPU data                         NCCL send/recv (cupy)
``tcp``        other node, host data                        Arrow IPC inline in a frame
=============  ===========================================  ==========================

`get_transport(name)` returns this process's instance of a transport (created on first
use); `select_transport(src, dst, batch)` returns the name to use.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from rlinf.comm._internal.locality import Locality
from rlinf.comm._internal.transports.base import (
    Exported,
    OnRelease,
    ReleaseOnce,
    Transport,
    host_copy,
)
from rlinf.comm._internal.transports.cuda_ipc import CudaIpcTransport
from rlinf.comm._internal.transports.inproc import InProcessTransport
from rlinf.comm._internal.transports.nccl import KeyValueStore, NcclTransport
from rlinf.comm._internal.transports.shared_memory import SharedMemoryTransport
from rlinf.comm._internal.transports.tcp import TcpTransport
from rlinf.comm.batch import Batch
from rlinf.comm.errors import TransportError

__all__ = [
    "TRANSPORT_TYPES",
    "CudaIpcTransport",
    "Exported",
    "InProcessTransport",
    "KeyValueStore",
    "Locality",
    "NcclTransport",
    "OnRelease",
    "ReleaseOnce",
    "SharedMemoryTransport",
    "TcpTransport",
    "Transport",
    "close_transports",
    "get_transport",
    "host_copy",
    "select_transport",
]

TRANSPORT_TYPES: dict[str, type[Transport]] = {
    t.name: t for t in (InProcessTransport, SharedMemoryTransport, TcpTransport,
                        CudaIpcTransport, NcclTransport)
}

_lock = threading.Lock()
_instances: dict[str, Transport] = {}


def get_transport(name: str) -> Transport:
    """This process's shared instance of the transport called `name`."""
    with _lock:
        found = _instances.get(name)
        if found is not None:
            return found
        if name not in TRANSPORT_TYPES:
            raise TransportError(f"expected a transport among {sorted(TRANSPORT_TYPES)}, "
                                 f"got {name!r}")
        if name == "cuda_ipc":
            shm = _instances.setdefault("shm", SharedMemoryTransport())
            if not isinstance(shm, SharedMemoryTransport):
                raise TransportError(f"expected the shm transport, got {type(shm).__name__}")
            instance: Transport = CudaIpcTransport(host=shm)
        else:
            instance = TRANSPORT_TYPES[name]()
        _instances[name] = instance
        return instance


def close_transports() -> None:
    """Close every transport instance of this process (owners' resources are freed)."""
    with _lock:
        instances = list(_instances.values())
        _instances.clear()
    for instance in instances:
        instance.close()


def select_transport(src: Locality, dst: Locality, batch: Batch | Mapping[str, Any], *,
                     override: str | None = None) -> str:
    """The transport name for sending `batch` from `src` to `dst`.

    `override` forces a transport (validated by name); otherwise: same process →
    ``inproc``; same node → ``cuda_ipc`` when any array is on a GPU, else ``shm``;
    other node → ``nccl`` when any array is on a GPU, else ``tcp``.
    """
    if override is not None:
        if override not in TRANSPORT_TYPES:
            raise TransportError(f"expected a transport among {sorted(TRANSPORT_TYPES)}, "
                                 f"got {override!r}")
        return override
    on_device = Batch.of(batch).on_device
    if src.same_process(dst):
        return "inproc"
    if src.same_node(dst):
        return "cuda_ipc" if on_device else "shm"
    return "nccl" if on_device else "tcp"
