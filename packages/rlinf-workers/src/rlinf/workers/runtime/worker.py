"""`Worker`: the base class of every RLinf worker (a Ray actor once a group launches it)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import structlog

from rlinf.sched.context_switch import CallbackOnloadable, Onloadable
from rlinf.sched.device_lock import DeviceLockClient, Grant
from rlinf.sched.local_lock import LocalDeviceLock, LocalLockClient
from rlinf.sched.profiler import Profile, Profiler
from rlinf.workers.errors import ConfigError
from rlinf.workers.runtime.context import WorkerContext, WorkerInfo
from rlinf.workers.runtime.dispatch import DispatchSpec
from rlinf.workers.runtime.distributed import (
    destroy_process_group,
    join_process_group,
    open_rendezvous_store,
)
from rlinf.workers.runtime.lazy_ray import connected, imported
from rlinf.workers.runtime.logs import configure_worker_logging

__all__ = ["LOCAL_LOCK", "Worker"]

LOCAL_LOCK = "local:"
"""Prefix of a device-lock address naming an in-process `rlinf.sched.LocalDeviceLock`."""


class Worker:
    """Base of RLinf workers: identity, a bound logger, profiling, and group hooks.

    Subclass it, take the `WorkerContext` first in ``__init__`` and pass it up::

        class Rollout(Worker):
            dispatch: ClassVar[Mapping[str, DispatchSpec]] = {"generate": SCATTER_CONCAT}

            def __init__(self, context: WorkerContext, *, model_path: str) -> None:
                super().__init__(context)
                ...

            def generate(self, prompts: torch.Tensor) -> torch.Tensor:
                with self.measure(batch_size=len(prompts)):
                    ...

    `WorkerGroup.launch(Rollout, ...)` starts one Ray actor per rank. `dispatch` maps
    method names to their default `DispatchSpec`; methods not listed broadcast their
    arguments and return one result per rank.
    """

    dispatch: ClassVar[Mapping[str, DispatchSpec]] = {}
    """Default split/gather rule per method name (overridable per call)."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        if context.log_level is not None:
            configure_worker_logging(context.log_level, role=context.role, rank=context.rank)
        self.log = structlog.get_logger(type(self).__module__).bind(
            role=context.role, rank=context.rank
        )
        self.profiler = Profiler(metadata={"role": context.role, "rank": context.rank})
        self._rendezvous_store: Any = None  # rank 0's torch TCPStore, kept alive while used
        self._device_lock: DeviceLockClient | LocalLockClient | None = None

    @property
    def role(self) -> str:
        """The component this worker implements."""
        return self.context.role

    @property
    def rank(self) -> int:
        """This worker's index in its group."""
        return self.context.rank

    @property
    def world_size(self) -> int:
        """Number of ranks in the group."""
        return self.context.world_size

    @property
    def devices(self) -> tuple[int, ...]:
        """Logical devices of this rank from the placement."""
        return self.context.devices

    @contextlib.contextmanager
    def measure(self, *, batch_size: int) -> Iterator[None]:
        """Time a step and record its peak memory in this worker's profiler (rlinf.sched)."""
        with self.profiler.measure(
            self.role, batch_size=batch_size, num_devices=max(len(self.devices), 1)
        ):
            yield

    @property
    def device_lock(self) -> DeviceLockClient | LocalLockClient:
        """This worker's device-lock client, connected on first use: to the run's lock
        server, or to the `rlinf.sched.LocalDeviceLock` of its process where the runtime
        found every component of its devices in this process (``local:`` addresses).

        If the worker implements `rlinf.sched.Onloadable` (``onload``/``offload``) it is
        registered as its role's component, starting offloaded: build state in host memory
        (or offload it) before the first `hold_devices`. Its size per device is the plan's
        (`WorkerContext.memory_bytes`), else `resident_memory_bytes()`: the lock keeps
        components that fit in a device together resident (`rlinf.sched.residency`).
        """
        if self._device_lock is None:
            address, token = self.context.device_lock_address, self.context.device_lock_token
            if address is None or token is None:
                raise ConfigError(
                    f"{self!r} has no device lock: launch its group with "
                    "device_lock_address= and device_lock_token="
                )
            owner = f"{self.context.group_name}-{self.rank}"
            client: DeviceLockClient | LocalLockClient
            if address.startswith(LOCAL_LOCK):  # components of this process only
                client = LocalDeviceLock.named(
                    address, device_memory=self.context.device_memory,
                ).client(owner, profiler=self.profiler)
            else:
                client = DeviceLockClient(address, token=token, profiler=self.profiler,
                                          owner=owner)
            if isinstance(self, Onloadable):
                memory = self.context.memory_bytes
                client.register(self.role, self, memory_bytes=(
                    memory if memory is not None else self.resident_memory_bytes()))
            else:  # nothing to move: it never needs others to leave, nor leaves itself
                client.register(self.role, CallbackOnloadable(_nothing, _nothing),
                                resident=True, memory_bytes=0)
            self._device_lock = client
        return self._device_lock

    def onloads_since(self, since: float) -> int:
        """Onloads this process's device lock ran since Unix time `since` (its context
        switches; 0 without a lock)."""
        if self._device_lock is None:
            return 0
        return sum(1 for event in self._device_lock.switch_events
                   if event.direction == "onload" and event.started >= since)

    def resident_memory_bytes(self) -> int | None:
        """Bytes this component keeps on each of its devices while resident (weights,
        optimizer state, caches); None when unknown, which makes the device lock evict
        every other component whenever this one takes a device. Override in workers that
        can tell (`rlinf.workers.rollout.offload.state_bytes` counts modules and
        optimizers)."""
        return None

    @contextlib.contextmanager
    def hold_devices(self, *, timeout: float) -> Iterator[Grant]:
        """Hold this rank's devices exclusively (onloading this role if another used them).

        Raises `rlinf.sched.DeviceLockTimeoutError` if not granted within `timeout`.
        """
        with self.device_lock.hold(self.devices, component=self.role, timeout=timeout) as grant:
            yield grant

    def profile(self) -> Profile:
        """Everything measured so far (the group gathers these to fit cost curves)."""
        return self.profiler.profile

    def worker_info(self) -> WorkerInfo:
        """Where this rank runs; the group asks once at launch (it doubles as readiness)."""
        ray = _connected_ray()
        if ray is None:  # a local rank (`rlinf.workers.runtime.local`)
            return WorkerInfo(rank=self.rank, node_ip="127.0.0.1", node_id="local",
                              pid=os.getpid())
        return WorkerInfo(
            rank=self.rank,
            node_ip=ray.util.get_node_ip_address(),
            node_id=ray.get_runtime_context().get_node_id(),
            pid=os.getpid(),
        )

    def open_rendezvous(self, *, timeout_s: float = 300.0) -> tuple[str, int]:
        """Rank 0: start the torch.distributed store; returns its ``(address, port)``."""
        ray = _connected_ray()
        host = ray.util.get_node_ip_address() if ray is not None else "127.0.0.1"
        self._rendezvous_store = open_rendezvous_store(
            host, world_size=self.world_size, timeout_s=timeout_s
        )
        return host, int(self._rendezvous_store.port)

    def init_process_group(
        self, *, master_addr: str, master_port: int, backend: str = "gloo",
        timeout_s: float = 300.0,
    ) -> None:
        """Join the group's default torch.distributed process group (all ranks at once)."""
        join_process_group(
            rank=self.rank, world_size=self.world_size, master_addr=master_addr,
            master_port=master_port, backend=backend, timeout_s=timeout_s,
            store=self._rendezvous_store,
        )
        self.log.info("process_group_joined", backend=backend, master=f"{master_addr}:"
                      f"{master_port}")

    def shutdown(self) -> None:
        """Release resources before the group kills the process; override (and call super)
        to clean up more."""
        destroy_process_group()
        self._rendezvous_store = None
        if self._device_lock is not None:
            self._device_lock.close()
            self._device_lock = None
        self.log.debug("worker_shutdown")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(role={self.role!r}, rank={self.rank}/{self.world_size})"


def _nothing() -> None:
    """The onload/offload of a worker that keeps no state on its devices."""


def _connected_ray() -> Any:
    """The `ray` module when this process is a Ray worker (or driver), else None (never
    imports Ray: a local rank has no use for it)."""
    return imported() if connected() else None
