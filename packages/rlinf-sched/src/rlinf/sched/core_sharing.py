"""How components on CPU slots share their node's cores, for the simulator.

A CPU slot is a logical device, not a core: a user may give a 2-core box 4 slots to try a
disaggregated placement, and even with one slot per core the runtime's own processes (the
driver, Ray, channel transfers) take CPU while components compute beside each other. On a
node whose devices are CPU slots and whose core count is known, each call of a component
runs one thread per slot it holds there, and the node's ``C`` cores are shared equally
(processor sharing) among the ``T`` threads computing at that moment plus the cluster's
``cpu_background`` ``b``: each thread runs at ``speed(T) = min(1, C / (T + b))``.

Cost curves are measured with the component computing alone, its own ``t`` threads already
sharing the node, so a call progresses at ``speed(T) / speed(t)`` of its profiled rate: alone
it takes exactly its profiled time, beside others it is stretched by their share. A call on
several nodes progresses at the rate of its slowest node. Its profiled time is read at the
slots that can compute at once (`parallel_devices`: on each node at most its cores): a cost
curve fitted on 1 and 2 slots of a 2-core node would otherwise promise a 4-slot call half
the time of a 2-slot one, where the extra slots add threads, not cores. GPU nodes, nodes of
unknown core count, and nodes with no more slots than cores and no background never slow
anything: the simulator keeps its fixed-duration schedule for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rlinf.sched.cluster import Cluster

__all__ = ["CoreSharing"]


@dataclass(frozen=True)
class CoreSharing:
    """The cores of the nodes whose CPU slots share them, and the runtime's background."""

    cores: Mapping[int, int]
    """Node index → CPU cores, for every node whose devices are CPU slots that contend."""
    background: float = 0.0
    """Cores' worth of CPU the runtime takes on each of those nodes (`Cluster.cpu_background`)."""

    @classmethod
    def of(cls, cluster: Cluster) -> CoreSharing | None:
        """The sharing model of `cluster`, or None when no node's slots contend (GPU nodes,
        unknown core counts, as many cores as slots without a background)."""
        cores = {node.index: node.cpus for node in cluster.nodes
                 if node.cpus > 0 and node.devices
                 and not any(cluster.devices[d].is_gpu for d in node.devices)
                 and (len(node.devices) > node.cpus or cluster.cpu_background > 0)}
        return cls(cores, cluster.cpu_background) if cores else None

    def threads(self, devices: Iterable[int], cluster: Cluster) -> dict[int, int]:
        """Threads a call on `devices` runs on each contended node (one per slot)."""
        out: dict[int, int] = {}
        for d in devices:
            node = cluster.node_of(d)
            if node in self.cores:
                out[node] = out.get(node, 0) + 1
        return out

    def parallel_devices(self, devices: Iterable[int], cluster: Cluster) -> int:
        """How many of `devices` can compute at once: on a contended node at most its cores,
        elsewhere each device (what a call's cost curve is read at)."""
        per_node: dict[int, int] = {}
        for d in devices:
            node = cluster.node_of(d)
            per_node[node] = per_node.get(node, 0) + 1
        return max(1, sum(min(count, self.cores[node]) if node in self.cores else count
                          for node, count in per_node.items()))

    def speed(self, node: int, threads: int) -> float:
        """Fraction of a core each of `threads` computing threads gets on `node`."""
        return min(1.0, self.cores[node] / (threads + self.background)) if threads else 1.0

    def rate(self, own: Mapping[int, int], computing: Mapping[int, int]) -> float:
        """Progress per second of a call running `own` threads per node while `computing`
        threads (its own included) compute there: 1 when alone, less beside others."""
        rate = 1.0
        for node, mine in own.items():
            rate = min(rate, self.speed(node, computing.get(node, 0)) / self.speed(node, mine))
        return rate

