"""Weight sync of a flow: one trainer group's weights into the groups that generate with them.

The driver holds control only: it asks the trainer to export (shared-memory or CUDA IPC
handles, or bucket layouts for a collective broadcast), hands those handles to the
receivers, which map and load the weights themselves, and finally lets the trainer release
its buffers. The workers implement the two halves (`rlinf.workers.flow.WeightSender` /
`WeightReceiver`); the transport follows from where the ranks run
(`rlinf.workers.weight_sync.choose_transport`): ``shm`` on CPU within a node, ``gloo``
across nodes, ``cuda_ipc`` between identical GPUs, ``nccl`` otherwise.
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
           "weight_transport"]

_log = structlog.get_logger(__name__)

WeightTransport = Literal["auto", "shm", "cuda_ipc", "nccl", "gloo"]
"""How a weight-sync edge moves weights (every component is its own Ray worker, so never
in-process): ``auto`` derives it from where the ranks run."""
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
    if wanted == "auto":
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


class WeightSync:
    """One weight-sync edge of a launched flow (see the module docstring)."""

    def __init__(self, sender: WorkerGroup, receivers: Sequence[WorkerGroup], *,
                 transport: str, wait: Wait) -> None:
        self.sender = sender
        self.receivers = tuple(receivers)
        self.transport = transport
        self._wait = wait

    def join(self) -> None:
        """For collective transports: trainer rank 0 and every receiver rank form one
        broadcast group (once, at launch)."""
        if self.transport not in ("nccl", "gloo"):
            return
        host, port = self.sender.call("weight_group_address", spec=RANK_ZERO)
        world = 1 + sum(g.world_size for g in self.receivers)
        futures = {self.sender.role: self.sender.call_async(
            "join_weight_group", host=host, port=port, world_size=world,
            backend=self.transport)}
        first = 1
        for group in self.receivers:
            n = group.world_size
            futures[group.role] = group.call_async(
                "join_weight_group", host=[host] * n, port=[port] * n,
                rank=list(range(first, first + n)), world_size=[world] * n,
                backend=[self.transport] * n, spec=PER_RANK_ALL)
            first += n
        self._wait(futures)

    def sync(self) -> float:
        """Move the trainer's current weights into every receiver; returns the seconds."""
        start = time.perf_counter()
        exported = self._wait({self.sender.role: self.sender.call_async(
            "export_weights", self.transport)})[self.sender.role][0]
        if self.transport in ("nccl", "gloo"):  # one broadcast: every member at once
            futures = {g.role: g.call_async("receive_weights", self.transport, exported)
                       for g in self.receivers}
            futures[self.sender.role] = self.sender.call_async("broadcast_weights")
            self._wait(futures)
        else:
            for group in self.receivers:
                self._wait({group.role: group.call_async("receive_weights", self.transport,
                                                         exported)})
            self._wait({self.sender.role: self.sender.call_async(
                "release_weights", exported, spec=RANK_ZERO)})
        return time.perf_counter() - start
