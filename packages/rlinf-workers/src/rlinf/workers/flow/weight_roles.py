"""Weight sync halves of flow components: a trainer sends buckets, generators receive them.

The runtime (`rlinf.workers.flow.weights.WeightSync`) picks the transport from where the ranks run
(`rlinf.workers.weight_sync.choose_transport`) and drives the two halves:

- ``inprocess`` (a receiver sharing the trainer's process): every trainer rank leaves its
  buckets in its process (`export_weights` returns their key), the receiver rank there
  copies them into its own weights (`rlinf.workers.weight_sync.sync_in_process`), and the
  trainer drops them;
- ``shm`` (CPU, one node): trainer rank 0 packs each bucket into a shared-memory segment
  and returns picklable handles; every receiver maps and loads them; the trainer then
  releases;
- ``cuda_ipc`` (GPU, collocated): the same with CUDA IPC handles of GPU buffers;
- ``nccl`` / ``gloo`` (across nodes or GPUs): trainer rank 0 and every receiver rank join
  one broadcast group at launch; per sync the trainer packs its buckets (inside its device
  turn), the driver hands the bucket layouts to the receivers, and all members broadcast
  together outside any device turn — members may share a device (a collocated placement
  over several nodes), and a broadcast needs every member at once, so an exclusive turn
  around it would deadlock. Each receiver then loads the received buffers inside its turn.

Receivers load weights inside a device turn: a generator that was offloaded (its weights
discarded while another component used the device) is onloaded first, then refilled. A
component derives from `WeightSender` (implementing `buckets`) or `WeightReceiver`
(implementing `weight_target`) next to its own base class.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from rlinf.workers.errors import ConfigError
from rlinf.workers.flow.worker import FlowWorker
from rlinf.workers.runtime import WorkerContext
from rlinf.workers.weight_sync import (
    Bucket,
    CollectiveWeightGroup,
    CudaIpcBucketHandle,
    CudaIpcWeightReceiver,
    CudaIpcWeightSender,
    ShmBucketHandle,
    ShmWeightReceiver,
    ShmWeightSender,
    TensorMeta,
    WeightTarget,
    plan_layout,
    sync_in_process,
)
from rlinf.workers.weight_sync.collective import Backend
from rlinf.workers.weight_sync.flat import unflatten_bucket

__all__ = ["BucketLayout", "WeightReceiver", "WeightSender", "free_port"]

BucketLayout = tuple[tuple[TensorMeta, ...], int]
"""A bucket's tensor layout and packed size (what a collective receiver allocates)."""

_GROUP = "rlinf-flow-weights"

_IN_PROCESS: dict[str, list[Bucket]] = {}
"""The buckets each trainer of this process exported ``inprocess``, by its role, until its
receivers here loaded them."""


def free_port() -> int:
    """A TCP port the OS reports free right now (for the weight group's store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class WeightSender(FlowWorker):
    """The trainer's half; subclasses implement `buckets` (collective on every rank)."""

    def __init__(self, context: WorkerContext, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self._shm_sender: ShmWeightSender | None = None
        self._ipc_sender: CudaIpcWeightSender | None = None
        self._weight_group: CollectiveWeightGroup | None = None
        self._packed: list[torch.Tensor] = []
        self._exported_bytes = 0

    @property
    def weight_device(self) -> torch.device:
        """Where the weights live (CUDA IPC exports from it, NCCL broadcasts on it)."""
        return torch.device("cpu")

    def buckets(self) -> Iterator[Bucket]:
        """The policy's parameters in buckets (every rank calls it)."""
        raise NotImplementedError

    def full_weights_on_every_rank(self) -> bool:
        """Whether `buckets` gives every rank the whole policy: then an ``inprocess`` sync
        hands each rank's own to the receivers in its process. A trainer whose first rank
        alone assembles the policy (a model-parallel cut) says no, and its receivers get it
        over the edge's transport."""
        return True

    def weight_group_address(self) -> tuple[str, int]:
        """Rank 0: where the weight group's rendezvous store will listen."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def join_weight_group(self, *, host: str, port: int, world_size: int,
                          backend: Backend) -> None:
        """Rank 0 joins the broadcast group as its root (other actor ranks do nothing)."""
        if self.rank == 0:
            self._weight_group = CollectiveWeightGroup(
                host=host, port=port, rank=0, world_size=world_size, backend=backend,
                device=self.weight_device if backend == "nccl" else "cpu",
                timeout=self.io_timeout, group_name=_GROUP)

    def export_weights(self, transport: str) -> list[Any]:
        """Pack the weights for `transport`: handles (shm, cuda_ipc) or layouts (collective).

        Every actor rank must call it (FSDP2 gathers shards); rank 0 returns the list, the
        others an empty one. Collective transports keep the buckets for `broadcast_weights`.
        """
        with self.turn("export_weights", transport=transport):
            buckets = list(self.buckets())
            self._exported_bytes = sum(t.numel() * t.element_size()
                                       for bucket in buckets for _, t in bucket)
            if transport == "inprocess":  # every rank: each serves the receivers beside it
                _IN_PROCESS[self.role] = buckets
                return [self.role] if self.rank == 0 else []
            if self.rank != 0:
                return []
            if transport == "shm":
                self._shm_sender = self._shm_sender or ShmWeightSender()
                cpu = [[(n, t.detach().cpu()) for n, t in b] for b in buckets]
                return [self._shm_sender.export(b) for b in cpu]
            if transport == "cuda_ipc":
                self._ipc_sender = self._ipc_sender or CudaIpcWeightSender(self.weight_device)
                return [self._ipc_sender.export(b) for b in buckets]
            if transport in ("nccl", "gloo"):
                if self._weight_group is None:
                    raise ConfigError(f"export_weights over {transport} before "
                                      "join_weight_group")
                self._packed = [self._weight_group.pack(b) for b in buckets]
                return [(tuple(metas), size) for metas, size in map(plan_layout, buckets)]
        raise ConfigError(f"unknown weight-sync transport {transport!r}")

    def last_export_bytes(self) -> int:
        """Bytes of the tensors this rank packed at its last `export_weights` (0 before)."""
        return self._exported_bytes

    def broadcast_weights(self) -> None:
        """Rank 0: broadcast the buckets of the last `export_weights` to the weight group."""
        if self.rank != 0:
            return
        if self._weight_group is None:
            raise ConfigError("broadcast_weights before join_weight_group")
        # No device turn: receivers on this device take part at the same time (docstring).
        for buffer in self._packed:
            self._weight_group.send_packed(buffer)
        self._packed = []

    def release_weights(self, handles: Sequence[Any]) -> None:
        """Free what `export_weights` packed (every receiver applied it): rank 0's shared
        buffers, or every rank's in-process buckets."""
        for handle in handles:
            if isinstance(handle, str):
                _IN_PROCESS.pop(handle, None)
            elif isinstance(handle, ShmBucketHandle) and self._shm_sender is not None:
                self._shm_sender.release(handle)
            elif isinstance(handle, CudaIpcBucketHandle) and self._ipc_sender is not None:
                self._ipc_sender.release(handle)

    def shutdown(self) -> None:
        """Free packed buffers and leave the weight group."""
        _IN_PROCESS.pop(self.role, None)
        if self._shm_sender is not None:
            self._shm_sender.close()
        if self._weight_group is not None:
            self._weight_group.close()
        super().shutdown()


class WeightReceiver(FlowWorker):
    """The generators' half; subclasses implement `weight_target`."""

    def __init__(self, context: WorkerContext, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self._shm_receiver: ShmWeightReceiver | None = None
        self._weight_group: CollectiveWeightGroup | None = None

    @property
    def weight_device(self) -> torch.device:
        """Where received weights go (NCCL receives on it)."""
        return torch.device("cpu")

    def weight_target(self) -> WeightTarget:
        """What loads the received buckets (an engine, an inference worker, a policy)."""
        raise NotImplementedError

    def loading_target(self) -> WeightTarget:
        """What a sync loads into: `weight_target` unless a subclass wraps it (an
        adapters-only sync merges LoRA adapters first)."""
        return self.weight_target()

    def join_weight_group(self, *, host: str, port: int, rank: int, world_size: int,
                          backend: Backend) -> None:
        """Join the broadcast group as member `rank` (>= 1)."""
        self._weight_group = CollectiveWeightGroup(
            host=host, port=port, rank=rank, world_size=world_size, backend=backend,
            device=self.weight_device if backend == "nccl" else "cpu",
            timeout=self.io_timeout, group_name=_GROUP)

    def receive_weights(self, transport: str, payload: Sequence[Any]) -> int:
        """Load the weights `payload` describes (handles or layouts); returns buckets loaded.
        A collective's buffers are received before the device turn (module docstring)."""
        received: list[torch.Tensor] = []
        if transport in ("nccl", "gloo"):
            if self._weight_group is None:
                raise ConfigError("receive_weights over a collective before join_weight_group")
            received = [self._weight_group.receive(size) for _, size in payload]
        with self.turn("receive_weights", transport=transport, buckets=len(payload)):
            target = self.loading_target()
            if transport == "inprocess":
                for key in payload:
                    buckets = _IN_PROCESS.get(key)
                    if not buckets:
                        raise ConfigError(f"no weights of {key!r} in this process: an "
                                          "'inprocess' sync needs its trainer's rank in the "
                                          "same process, holding the whole policy")
                    sync_in_process(buckets, target)
            elif transport == "shm":
                self._shm_receiver = self._shm_receiver or ShmWeightReceiver()
                for handle in payload:
                    self._shm_receiver.apply(handle, target)
            elif transport == "cuda_ipc":
                receiver = CudaIpcWeightReceiver()
                for handle in payload:
                    receiver.apply(handle, target)
            elif transport in ("nccl", "gloo"):
                for (metas, _), buffer in zip(payload, received, strict=True):
                    target.update_weights(unflatten_bucket(buffer, list(metas)))
            else:
                raise ConfigError(f"unknown weight-sync transport {transport!r}")
        return len(payload)

    def shutdown(self) -> None:
        """Unmap segments and leave the weight group."""
        if self._shm_receiver is not None:
            self._shm_receiver.close()
        if self._weight_group is not None:
            self._weight_group.close()
        super().shutdown()
