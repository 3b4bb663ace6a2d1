"""Weight sync when actor and rollout live in one process: hand the buckets over."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import structlog

from rlinf.workers.weight_sync.buckets import Bucket, tensor_bytes

__all__ = ["WeightTarget", "sync_in_process"]

_log = structlog.get_logger(__name__)


class WeightTarget(Protocol):
    """Anything that loads named tensors: rollout engines and workers, inference workers."""

    def update_weights(self, named_tensors: Bucket) -> None:
        """Load a bucket of ``(name, tensor)`` pairs."""
        ...


def sync_in_process(buckets: Iterable[Bucket], target: WeightTarget) -> int:
    """Load every bucket into `target` by reference (the target copies into its own
    parameters); returns the bytes synced."""
    total = count = 0
    for bucket in buckets:
        target.update_weights(bucket)
        total += sum(tensor_bytes(t) for _, t in bucket)
        count += 1
    _log.debug("weights_synced", transport="inprocess", buckets=count, bytes=total)
    return total
