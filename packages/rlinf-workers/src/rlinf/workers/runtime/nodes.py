"""Which Ray node each rank runs on: from the placement's devices to Ray node ids, and back.

A placement names logical devices numbered across the `rlinf.sched.Cluster`'s nodes. When
the cluster was discovered from a live Ray cluster (`Cluster.discover()` after
``ray.init``), every `Node` carries its Ray node id and `rank_node_ids` maps each rank to
the node that owns its device, checked against the nodes Ray reports alive; the group then
pins the rank there. A cluster from a description (JSON/YAML, `Cluster.uniform`) carries no
node ids: ranks go wherever Ray has room, as on a single machine.

`same_node`/`on_one_node` answer "do these ranks share a node?" from the node ids the ranks
reported at launch (`WorkerGroup.infos`), i.e. where they really run, which is what a
weight-sync transport (shared memory vs. TCP/gloo) must be chosen from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rlinf.sched.cluster import Cluster, Node
from rlinf.sched.placement import ComponentPlacement
from rlinf.workers.errors import ConfigError
from rlinf.workers.runtime.context import WorkerInfo, rank_devices

__all__ = ["check_node_capacity", "on_one_node", "rank_node_ids", "same_node"]

_ID_CHARS = 12  # a Ray node id is 56 hex characters; this many name it in messages


def same_node(a: WorkerInfo, b: WorkerInfo) -> bool:
    """Whether two launched ranks run on the same Ray node (from their reported node ids)."""
    return a.node_id == b.node_id


def on_one_node(infos: Iterable[WorkerInfo]) -> bool:
    """Whether all these ranks (e.g. an actor's and a rollout's) run on one Ray node."""
    return len({info.node_id for info in infos}) <= 1


def rank_node_ids(
    placement: ComponentPlacement, cluster: Cluster, *, alive: Mapping[str, str],
) -> tuple[str, ...] | None:
    """The Ray node id each rank of `placement` must run on, or None when `cluster` names no
    Ray nodes (a described cluster: no pinning).

    `alive` maps the live Ray cluster's node ids to their addresses (``ray.nodes()``).
    Raises `ConfigError` naming the device, the rank and the nodes available when a device is
    not in `cluster`, or its node is not alive in Ray (the cluster was discovered from
    another Ray session, or the node left since), or when only some nodes carry ids.
    """
    with_ids = [node for node in cluster.nodes if node.ray_node_id is not None]
    if not with_ids:
        return None
    if len(with_ids) != cluster.num_nodes:
        bare = [node.index for node in cluster.nodes if node.ray_node_id is None]
        raise ConfigError(f"cluster {cluster.name!r} gives Ray node ids for some nodes but not "
                          f"for node(s) {bare}: rediscover it with Cluster.discover() after "
                          "ray.init(), or describe it without node ids")
    ids: list[str] = []
    for rank in range(placement.num_procs):
        (device,) = rank_devices(placement, rank)
        where = f"placement {placement.to_spec()!r} puts rank {rank} on device {device}"
        if device >= cluster.num_devices:
            raise ConfigError(f"{where}, but no node of the Ray cluster has it: "
                              f"{_describe_nodes(cluster, alive)}. Place the component on "
                              "these devices, or add the node that should own it to Ray and "
                              "rediscover the cluster")
        node = cluster.nodes[cluster.node_of(device)]
        node_id = str(node.ray_node_id)
        if node_id not in alive:
            raise ConfigError(f"{where} of node {_name(node)}, which is not alive in the Ray "
                              f"cluster; {_describe_nodes(cluster, alive)}. Rediscover the "
                              "cluster (Cluster.discover() after ray.init()) and plan again")
        ids.append(node_id)
    return tuple(ids)


def _name(node: Node) -> str:
    node_id = (node.ray_node_id or "")[:_ID_CHARS]
    address = f" at {node.address}" if node.address else ""
    return f"{node.index} ({node.hostname}{address}, Ray node {node_id})"


def _describe_nodes(cluster: Cluster, alive: Mapping[str, str]) -> str:
    known = []
    for node in cluster.nodes:
        devices = ("no devices" if not node.devices
                   else f"device {node.devices[0]}" if len(node.devices) == 1
                   else f"devices {node.devices[0]}-{node.devices[-1]}")
        state = "alive" if node.ray_node_id in alive else "not alive"
        known.append(f"node {_name(node)}: {devices}, {state}")
    live = ", ".join(f"{node_id[:_ID_CHARS]} at {address}" if address else node_id[:_ID_CHARS]
                     for node_id, address in sorted(alive.items()))
    return f"the cluster has {'; '.join(known)}; Ray's alive nodes are {live or 'none'}"


def check_node_capacity(
    role: str, node_ids: Iterable[str], *, per_rank: Mapping[str, float],
    totals: Mapping[str, Mapping[str, float]],
) -> None:
    """Fail early when the ranks pinned to one node ask for more than the node has at all.

    `per_rank` is each rank's Ray resource request (``{"CPU": 1.0, "GPU": 0.0}``), `totals`
    each node's total resources (``ray.nodes()``). Ray would otherwise wait for the missing
    resources forever and the launch would end in a timeout that does not say why.
    """
    counts: dict[str, int] = {}
    for node_id in node_ids:
        counts[node_id] = counts.get(node_id, 0) + 1
    for node_id, ranks in counts.items():
        for resource, amount in per_rank.items():
            have = float(totals.get(node_id, {}).get(resource, 0.0))
            if amount > 0 and ranks * amount > have + 1e-9:
                raise ConfigError(
                    f"{role!r} puts {ranks} rank(s) x {amount:g} {resource} on Ray node "
                    f"{node_id[:_ID_CHARS]}, which has {have:g} {resource} in total: lower "
                    f"the per-rank {resource} request or place fewer ranks on that node's "
                    "devices")
