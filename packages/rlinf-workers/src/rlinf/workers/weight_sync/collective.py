"""Weight sync across processes with a collective broadcast: NCCL (GPU, any node) or gloo.

Disaggregated placement puts actor and rollout on different devices, possibly different
nodes. They form a dedicated process group (its own TCPStore rendezvous, separate from the
trainer's data-parallel group): rank 0 is the trainer rank that owns the full weights, the
other ranks are rollout workers. For each bucket the sender broadcasts one packed buffer
and every receiver unpacks it in place into its model. The layout (`TensorMeta`s, from
`plan_layout`) travels ahead over the control path so receivers can allocate the buffer.
With ``backend="gloo"`` the same code runs on CPU, which is how it is tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist

from rlinf.workers.errors import ConfigError
from rlinf.workers.weight_sync.buckets import Bucket
from rlinf.workers.weight_sync.flat import TensorMeta, flatten_bucket, unflatten_bucket
from rlinf.workers.weight_sync.inprocess import WeightTarget

__all__ = ["CollectiveWeightGroup"]

Backend = Literal["nccl", "gloo"]


class CollectiveWeightGroup:
    """One member of a weight-broadcast group (see the module docstring)."""

    def __init__(
        self, *, host: str, port: int, rank: int, world_size: int, backend: Backend = "nccl",
        device: torch.device | str | None = None, timeout: float = 300.0,
        group_name: str = "rlinf-weight-sync",
    ) -> None:
        """Join the group; rank 0 hosts the rendezvous store at ``host:port``.

        Every member must call this (the constructor blocks until all have joined).
        """
        if backend not in ("nccl", "gloo"):
            raise ConfigError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in [0, {world_size}), got {rank}")
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.device = torch.device(device or ("cuda" if backend == "nccl" else "cpu"))
        wait = timedelta(seconds=timeout)
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=wait)
        prefixed = dist.PrefixStore(group_name, store)
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = wait
            # A Backend object (not a ProcessGroup): it is driven directly, outside c10d.
            self._group: Any = dist.ProcessGroupNCCL(
                prefixed, rank, world_size, options)
        else:
            self._group = dist.ProcessGroupGloo(prefixed, rank, world_size, wait)
        self._store = store  # the master store must outlive the group

    def pack(self, bucket: Bucket) -> torch.Tensor:
        """Rank 0: one bucket packed into a buffer on the group's device (a copy: the
        weights may change or move after this, the buffer does not)."""
        buffer, _ = flatten_bucket(bucket, device=self.device)
        return buffer

    def send(self, bucket: Bucket) -> None:
        """Rank 0: broadcast one bucket (receivers call `recv` with its layout)."""
        self.send_packed(self.pack(bucket))

    def send_packed(self, buffer: torch.Tensor) -> None:
        """Rank 0: broadcast a buffer `pack` made."""
        if self.rank != 0:
            raise ConfigError("only rank 0 (the trainer) sends weights")
        self._broadcast(buffer)

    def receive(self, nbytes: int) -> torch.Tensor:
        """Ranks > 0: receive one bucket's packed buffer (load it with `unflatten_bucket`)."""
        if self.rank == 0:
            raise ConfigError("rank 0 sends; receivers have rank >= 1")
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        self._broadcast(buffer)
        return buffer

    def recv(self, metas: Sequence[TensorMeta], nbytes: int, target: WeightTarget) -> None:
        """Ranks > 0: receive the bucket laid out as `metas` and load it into `target`."""
        target.update_weights(unflatten_bucket(self.receive(nbytes), list(metas)))

    def _broadcast(self, buffer: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self._group.broadcast([buffer], options).wait()

    def close(self) -> None:
        """Leave the group."""
        shutdown = getattr(self._group, "shutdown", None)
        if shutdown is not None:
            shutdown()
