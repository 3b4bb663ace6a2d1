"""The worker runtime: `Worker` (a Ray actor base) and `WorkerGroup` (ranks + typed dispatch)."""

from rlinf.workers.runtime.allocator import DEFAULT_ALLOCATOR, HostAllocator, allocator_env
from rlinf.workers.runtime.context import WorkerContext, WorkerInfo, rank_devices
from rlinf.workers.runtime.dispatch import (
    ALL_TO_ALL,
    PER_RANK_ALL,
    RANK_ZERO,
    SCATTER_CONCAT,
    DispatchSpec,
    Gather,
    Split,
    concat_values,
    split_value,
)
from rlinf.workers.runtime.group import GroupFuture, WorkerGroup, count_onloads
from rlinf.workers.runtime.logs import configure_worker_logging
from rlinf.workers.runtime.nodes import on_one_node, rank_node_ids, same_node
from rlinf.workers.runtime.worker import Worker

__all__ = [
    "ALL_TO_ALL",
    "DEFAULT_ALLOCATOR",
    "PER_RANK_ALL",
    "RANK_ZERO",
    "SCATTER_CONCAT",
    "DispatchSpec",
    "Gather",
    "GroupFuture",
    "HostAllocator",
    "Split",
    "Worker",
    "WorkerContext",
    "WorkerGroup",
    "WorkerInfo",
    "allocator_env",
    "concat_values",
    "configure_worker_logging",
    "count_onloads",
    "on_one_node",
    "rank_devices",
    "rank_node_ids",
    "same_node",
    "split_value",
]
