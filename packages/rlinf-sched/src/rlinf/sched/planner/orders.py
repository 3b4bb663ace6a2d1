"""Device orders: the sequences of devices the planner cuts into contiguous ranges.

Candidates give each component a contiguous range of *positions* in a device order; the
devices at those positions are its device set. In the cluster's own order a set is a
contiguous run of global indices; on a mixed cluster (e.g. memory 80, 80, 24, 24, 24, 24,
80, 80 GB) the best plan may need the four 80 GB devices for one component, ``0-1,6-7``.
So the planner also searches orders that put equal devices next to each other: node by
node with the largest memory first (a component stays on one node), and by memory across
nodes (a component gets every large device). On a homogeneous cluster they are all the
cluster's own order and add nothing.
"""

from __future__ import annotations

from rlinf.sched.cluster import Cluster

__all__ = ["device_orders"]


def device_orders(cluster: Cluster, *, reorder: bool = True) -> list[tuple[int, ...]]:
    """Distinct orders to plan over: the cluster's own first, then (with `reorder`) by
    (node, memory largest first) and by (memory largest first, node), ties by index."""
    devices = cluster.devices
    own = tuple(range(cluster.num_devices))
    if not reorder:
        return [own]
    by_node = tuple(sorted(own, key=lambda d: (devices[d].node, -devices[d].memory_bytes, d)))
    by_memory = tuple(sorted(own, key=lambda d: (-devices[d].memory_bytes, devices[d].node, d)))
    return list(dict.fromkeys((own, by_node, by_memory)))
