"""Weight sync between processes on one node, CPU tensors: POSIX shared memory.

The sender packs each bucket into a pooled `rlinf.comm` shared-memory segment (one copy)
and hands out a small picklable `ShmBucketHandle`; the receiver maps the segment, views the
tensors in place (zero-copy) and loads them into its model (the one copy it must make).
Segments are 0600, reused across syncs, and unlinked even if the sender is killed
(rlinf.comm's guardian). The handle travels over whatever control path the caller has (a
Ray call, a channel); the sender releases the segment once the receiver has applied it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf.comm.shm import SegmentPool, SegmentReader
from rlinf.workers.weight_sync.buckets import Bucket
from rlinf.workers.weight_sync.flat import TensorMeta, flatten_bucket, plan_layout, unflatten_bucket
from rlinf.workers.weight_sync.inprocess import WeightTarget

__all__ = ["ShmBucketHandle", "ShmWeightReceiver", "ShmWeightSender"]


@dataclass(frozen=True)
class ShmBucketHandle:
    """Where a bucket waits in shared memory (picklable; no tensor data)."""

    segment: str
    """Name of the shared-memory segment."""
    nbytes: int
    """Bytes of the packed bucket at the segment's start."""
    metas: tuple[TensorMeta, ...]
    """Layout of the tensors in the packed bytes."""


class ShmWeightSender:
    """Actor side: packs buckets into shared memory (see the module docstring)."""

    def __init__(self, *, max_free_bytes: int = 1 << 30) -> None:
        self._pool = SegmentPool(max_free_bytes=max_free_bytes)

    def export(self, bucket: Bucket) -> ShmBucketHandle:
        """Copy `bucket` (CPU tensors) into a segment; valid until `release`."""
        metas, size = plan_layout(bucket)
        segment = self._pool.acquire(max(size, 1))
        buffer = torch.frombuffer(segment.view, dtype=torch.uint8, count=max(size, 1))
        flatten_bucket(bucket, out=buffer)
        return ShmBucketHandle(segment=segment.name, nbytes=size, metas=tuple(metas))

    def release(self, handle: ShmBucketHandle) -> None:
        """Return the segment to the pool (the receiver is done with it)."""
        self._pool.release(handle.segment)

    def close(self) -> None:
        """Unlink every segment of this sender."""
        self._pool.close()


class ShmWeightReceiver:
    """Rollout side: maps a handle's segment and loads the bucket into a target."""

    def __init__(self) -> None:
        self._reader = SegmentReader()

    def apply(self, handle: ShmBucketHandle, target: WeightTarget) -> None:
        """Load the bucket behind `handle` into `target` (its `update_weights` copies)."""
        view = self._reader.open_view(handle.segment, 0, max(handle.nbytes, 1))
        buffer = torch.frombuffer(view, dtype=torch.uint8)
        target.update_weights(unflatten_bucket(buffer, list(handle.metas)))

    def close(self) -> None:
        """Unmap cached segments."""
        self._reader.close()
