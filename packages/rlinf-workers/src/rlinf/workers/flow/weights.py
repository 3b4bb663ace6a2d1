"""Weight sync of a flow: one trainer group's weights into the groups that generate with them.

The driver holds control only: it asks the trainer to export (shared-memory or CUDA IPC
handles, or bucket layouts for a collective broadcast), hands those handles to the
receivers, which map and load the weights themselves, and finally lets the trainer release
its buffers. The workers implement the two halves (`rlinf.workers.flow.WeightSender` /
`WeightReceiver`); the transport to each receiver follows from where its ranks run
(`rlinf.workers.weight_sync.choose_transport`): ``inprocess`` where it shares the trainer's
processes (the receiver copies the trainer's tensors, nothing is packed), ``shm`` on CPU
within a node, ``gloo`` across nodes, ``cuda_ipc`` between identical GPUs, ``nccl``
otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import structlog

from rlinf.sched import Placement
from rlinf.workers.errors import ConfigError
from rlinf.workers.runtime import PER_RANK_ALL, RANK_ZERO, GroupFuture, WorkerGroup, on_one_node

__all__ = ["RECEIVER_METHODS", "SENDER_METHODS", "TRANSPORTS", "WeightSync", "WeightTransport",
           "same_processes", "weight_transport"]

_log = structlog.get_logger(__name__)

WeightTransport = Literal["auto", "shm", "cuda_ipc", "nccl", "gloo"]
"""How a weight-sync edge moves weights: ``auto`` derives it from where the ranks run (and
hands the tensors over where a receiver shares the trainer's processes)."""
TRANSPORTS: tuple[WeightTransport, ...] = ("auto", "shm", "cuda_ipc", "nccl", "gloo")

SENDER_METHODS = ("export_weights", "release_weights", "broadcast_weights",
                  "weight_group_address", "join_weight_group")
"""Methods a trainer's worker implements (`rlinf.workers.flow.WeightSender`)."""
RECEIVER_METHODS = ("receive_weights", "join_weight_group")
"""Methods a receiver's worker implements (`rlinf.workers.flow.WeightReceiver`)."""

Wait = Callable[[Mapping[str, GroupFuture]], dict[str, list[Any]]]
"""The flow's fail-fast wait: every future's per-rank results, or the first rank's error."""


def weight_transport(sender: WorkerGroup, receivers: Sequence[WorkerGroup], *,
                     placement: Placement, on_gpu: bool,
                     wanted: WeightTransport = "auto") -> str:
    """The transport between `sender` and `receivers` as they run (their reported nodes, not
    where the plan meant them): `wanted` if it can work there, the derived one for
    ``"auto"``; a forced transport that cannot work is a `ConfigError` saying why."""
    from rlinf.workers.weight_sync import choose_transport  # torch: only when weights move

    infos = [info for group in (sender, *receivers) for info in group.infos]
    same_node = on_one_node(infos)
    same_device = all(placement.devices_of(g.role) == placement.devices_of(sender.role)
                      for g in receivers)
    edge = f"{sender.role} -> {[g.role for g in receivers]}"
    if wanted == "auto":  # (WeightSync hands the weights over to receivers in-process)
        return choose_transport(same_process=False, same_node=same_node,
                                same_device=same_device, on_gpu=on_gpu)
    if wanted == "shm" and not same_node:
        raise ConfigError(f"weight sync {edge}: 'shm' needs every rank on one node, but Ray "
                          "runs them on several; use 'auto' (gloo/nccl across nodes)")
    if wanted == "cuda_ipc" and not (on_gpu and same_device):
        raise ConfigError(f"weight sync {edge}: 'cuda_ipc' needs the receivers on the "
                          f"trainer's GPUs, but the placement is {placement.to_spec()!r}; "
                          "use 'auto'")
    if wanted == "shm" and on_gpu:
        _log.warning("weight_sync_shm_on_gpu", edge=edge, detail="weights pass through host memory")
    if wanted == "nccl" and not on_gpu:
        return "gloo"
    return wanted


def same_processes(a: WorkerGroup, b: WorkerGroup) -> bool:
    """Whether rank r of `a` and of `b` run in one process, for every r."""
    mine = {info.rank: (info.node_id, info.pid) for info in a.infos}
    theirs = {info.rank: (info.node_id, info.pid) for info in b.infos}
    return bool(mine) and mine == theirs


class WeightSync:
    """One weight-sync edge of a launched flow (see the module docstring), with the transport
    to each receiver: ``inprocess`` to those that share the trainer's processes, the edge's
    own to the others."""

    def __init__(self, sender: WorkerGroup, receivers: Sequence[WorkerGroup], *,
                 transport: str, wait: Wait, in_process: bool = True) -> None:
        """`in_process`: the trainer's ranks each hold the whole policy
        (`WeightSender.full_weights_on_every_rank`), so receivers in their processes copy it
        there; otherwise every receiver takes `transport`."""
        self.sender = sender
        self.receivers = tuple(receivers)
        self.transports = tuple("inprocess" if in_process and same_processes(sender, g)
                                else transport for g in self.receivers)
        """The transport to each receiver, in order."""
        self._wait = wait

    @property
    def transport(self) -> str:
        """The edge's transports, in receiver order without repeats, joined by ``+``
        (``"inprocess+shm"`` where one receiver shares the trainer's processes)."""
        return "+".join(dict.fromkeys(self.transports))

    def _collective(self) -> list[tuple[WorkerGroup, str]]:
        return [(g, t) for g, t in zip(self.receivers, self.transports, strict=True)
                if t in ("nccl", "gloo")]

    def join(self) -> None:
        """For collective transports: trainer rank 0 and every receiver rank that takes a
        broadcast form one broadcast group (once, at launch)."""
        collective = self._collective()
        if not collective:
            return
        backend = collective[0][1]
        host, port = self.sender.call("weight_group_address", spec=RANK_ZERO)
        world = 1 + sum(g.world_size for g, _ in collective)
        futures = {self.sender.role: self.sender.call_async(
            "join_weight_group", host=host, port=port, world_size=world, backend=backend)}
        first = 1
        for group, _ in collective:
            n = group.world_size
            futures[group.role] = group.call_async(
                "join_weight_group", host=[host] * n, port=[port] * n,
                rank=list(range(first, first + n)), world_size=[world] * n,
                backend=[backend] * n, spec=PER_RANK_ALL)
            first += n
        self._wait(futures)

    def sync(self) -> float:
        """Move the trainer's current weights into every receiver; returns the seconds."""
        start = time.perf_counter()
        exported: dict[str, Any] = {}
        for transport in dict.fromkeys(self.transports):
            # In-process exports stay on every trainer rank (each serves its own process).
            exported[transport] = self._wait({self.sender.role: self.sender.call_async(
                "export_weights", transport)})[self.sender.role][0]
        collective = self._collective()
        if collective:  # one broadcast: every member at once
            futures = {g.role: g.call_async("receive_weights", t, exported[t])
                       for g, t in collective}
            futures[self.sender.role] = self.sender.call_async("broadcast_weights")
            self._wait(futures)
        for group, transport in zip(self.receivers, self.transports, strict=True):
            if transport not in ("nccl", "gloo"):
                self._wait({group.role: group.call_async("receive_weights", transport,
                                                         exported[transport])})
        for transport, handles in exported.items():
            if transport not in ("nccl", "gloo"):
                self._wait({self.sender.role: self.sender.call_async(
                    "release_weights", handles,
                    spec=None if transport == "inprocess" else RANK_ZERO)})
        return time.perf_counter() - start
