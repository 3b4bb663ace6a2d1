"""torch.distributed across the ranks of a `WorkerGroup`: rendezvous without a port race.

Rank 0 opens a `TCPStore` on port 0 (the OS picks a free port, so two groups on one node
never collide) and reports its address; then every rank joins the default process group
through that store, concurrently (joining blocks until all ranks arrive). The driver side
is `WorkerGroup.init_process_group`; these are the per-process halves.
"""

from __future__ import annotations

import datetime
from typing import Any

from rlinf.workers.errors import ConfigError

__all__ = ["destroy_process_group", "join_process_group", "open_rendezvous_store"]

BACKENDS = ("gloo", "nccl")


def open_rendezvous_store(host: str, *, world_size: int, timeout_s: float) -> Any:
    """Start the rendezvous store on `host` with an OS-chosen port (read ``store.port``)."""
    import torch.distributed as dist

    return dist.TCPStore(host, 0, world_size, True,
                         timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


def join_process_group(
    *, rank: int, world_size: int, master_addr: str, master_port: int, backend: str,
    timeout_s: float, store: Any = None,
) -> None:
    """Initialise the default process group; rank 0 passes the store it opened.

    Blocks until every rank has joined or `timeout_s` passes (torch then raises).
    """
    import torch.distributed as dist

    if backend not in BACKENDS:
        raise ConfigError(f"unknown torch.distributed backend {backend!r}; expected {BACKENDS}")
    if dist.is_initialized():
        raise ConfigError("this process already joined a default process group; "
                          "call destroy_process_group first")
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(master_addr, master_port, world_size, False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timeout)


def destroy_process_group() -> None:
    """Leave the default process group if this process joined one."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
