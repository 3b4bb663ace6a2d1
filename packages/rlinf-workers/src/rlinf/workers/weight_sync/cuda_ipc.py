"""Weight sync between processes sharing a GPU (collocated placement): CUDA IPC.

The sender packs a bucket into one CUDA buffer and exports it with
`torch.multiprocessing.reductions.reduce_tensor` — a picklable handle of the allocation,
not the data. The receiver opens the handle (mapping the same GPU memory; no copy over
the host), loads the views into its model, and synchronizes before answering, so the
sender may free the buffer once `apply` has returned. Both processes must see the GPU
under the same device index.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from rlinf.workers.rollout.types import RolloutError
from rlinf.workers.weight_sync.buckets import Bucket
from rlinf.workers.weight_sync.flat import TensorMeta, flatten_bucket, unflatten_bucket
from rlinf.workers.weight_sync.inprocess import WeightTarget

__all__ = ["CudaIpcBucketHandle", "CudaIpcWeightReceiver", "CudaIpcWeightSender"]


@dataclass(frozen=True)
class CudaIpcBucketHandle:
    """A CUDA allocation holding a packed bucket (picklable)."""

    key: int
    """Sender-local id, for `CudaIpcWeightSender.release`."""
    rebuild: tuple[Any, tuple[Any, ...]]
    """``(function, args)`` from ``reduce_tensor``; calling it maps the buffer."""
    metas: tuple[TensorMeta, ...]
    """Layout of the tensors in the buffer."""


class CudaIpcWeightSender:
    """Trainer side: packs buckets on the GPU and exports IPC handles."""

    def __init__(self, device: torch.device | str = "cuda") -> None:
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise RolloutError(f"CUDA IPC needs a CUDA device, got {self.device}")
        self._live: dict[int, torch.Tensor] = {}
        self._keys = itertools.count()

    def export(self, bucket: Bucket) -> CudaIpcBucketHandle:
        """Pack `bucket` into a new CUDA buffer and export it; valid until `release`."""
        from torch.multiprocessing.reductions import reduce_tensor

        buffer, metas = flatten_bucket(bucket, device=self.device)
        torch.cuda.synchronize(self.device)  # the copy must land before the peer reads
        key = next(self._keys)
        self._live[key] = buffer
        return CudaIpcBucketHandle(key=key, rebuild=reduce_tensor(buffer), metas=tuple(metas))

    def release(self, handle: CudaIpcBucketHandle) -> None:
        """Free the buffer (the receiver has applied it)."""
        self._live.pop(handle.key, None)

    def close(self) -> None:
        """Free every exported buffer."""
        self._live.clear()
        torch.cuda.empty_cache()


class CudaIpcWeightReceiver:
    """Rollout side: opens a handle and loads the bucket into a target."""

    def apply(self, handle: CudaIpcBucketHandle, target: WeightTarget) -> None:
        """Map the sender's buffer, load it, and synchronize before returning."""
        function, args = handle.rebuild
        buffer = function(*args)
        target.update_weights(unflatten_bucket(buffer, list(handle.metas)))
        torch.cuda.synchronize(buffer.device)
        del buffer
