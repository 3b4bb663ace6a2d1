"""Several workers in one process: `SharedProcess` (the Ray actor) and `launch_shared`.

Components that a plan places on the same devices take turns there; in processes of their
own each pays a process start (Python, torch and its models imported again: several
CPU-seconds) and every hand-over between them crosses processes. `launch_shared` starts one
`SharedProcess` per rank instead, which constructs each member worker in turn (rank r of
every member in process r) and serves their calls, each member's calls one at a time as in
a process of its own, different members' concurrently (threads: an entry that waits on a
channel does not stop the member that feeds it). It returns one `WorkerGroup` per member,
so callers address members exactly as they address groups of their own.

A member's failing constructor is reported as its own `WorkerDiedError` (method
``__init__``), and every process is killed; a dead process fails every member's calls.
`WorkerGroup.shutdown` of a member runs that member's hook; the processes are killed with
the last member's.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlinf.workers.errors import ConfigError, WorkerDiedError, WorkersError
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.runtime.worker import Worker

__all__ = ["SharedMember", "SharedProcess"]


@dataclass(frozen=True)
class SharedMember:
    """One worker to construct in a shared process (per rank)."""

    worker_cls: type[Worker]
    """The member's worker class."""
    role: str
    """Its component name (its group's role)."""
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Constructor arguments after its `WorkerContext`."""
    device_lock_address: str | None = None
    """Its device lock, when it takes turns (`WorkerContext.device_lock_address`)."""
    device_lock_token: bytes | None = field(default=None, repr=False)
    """The lock's secret."""
    memory_bytes: int | None = None
    """Bytes per device the plan priced for it (`WorkerContext.memory_bytes`)."""
    device_memory: int | None = None
    """Bytes of each of its devices, for an in-process lock (`WorkerContext.device_memory`)."""

    def __post_init__(self) -> None:
        if not issubclass(self.worker_cls, Worker):
            raise ConfigError(f"{self.worker_cls!r} is not a subclass of rlinf.workers Worker")


class SharedProcess(Worker):
    """A Ray actor that constructs and serves several member workers (module docstring).

    Launched with ``max_concurrency`` above one (a threaded actor); `add_member` constructs
    a member, `call_member` calls one of its methods under the member's own lock.
    """

    def __init__(self, context: WorkerContext) -> None:
        super().__init__(context)
        self._members: dict[str, Worker] = {}
        self._locks: dict[str, threading.Lock] = {}

    def add_member(self, worker_cls: type[Worker], context: WorkerContext,
                   init_kwargs: Mapping[str, Any]) -> None:
        """Construct member `context.role` in this process."""
        if context.role in self._members:
            raise ConfigError(f"member {context.role!r} is already in this process")
        self._members[context.role] = worker_cls(context, **dict(init_kwargs))
        self._locks[context.role] = threading.Lock()

    def call_member(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``member.method(*args, **kwargs)``, one call of that member at a time."""
        member = self._members.get(role)
        if member is None:
            raise ConfigError(f"no member {role!r} in this process (members: "
                              f"{sorted(self._members)})")
        with self._locks[role]:
            return getattr(member, method)(*args, **kwargs)

    def shutdown(self) -> None:
        """Every member's hook (last constructed first), then this process's own."""
        for role in reversed(list(self._members)):
            with self._locks[role]:
                self._members[role].shutdown()
        super().shutdown()


def member_died(role: str, error: WorkersError) -> WorkerDiedError:
    """A member's failing constructor as the error a group of its own gives
    (`WorkerDiedError` with method ``__init__``)."""
    rank = int(getattr(error, "rank", 0) or 0)
    node = getattr(error, "node", None)
    if isinstance(error, WorkerDiedError):
        return WorkerDiedError(role, rank, node=node, method="__init__",
                               detail=f"its shared process died while constructing it: "
                                      f"{getattr(error, 'detail', error)}")
    detail = getattr(error, "detail", str(error))
    return WorkerDiedError(role, rank, node=node, method="__init__",
                           detail=f"its constructor raised {detail}")


def members_of(members: Sequence[SharedMember]) -> str:
    """The role name of a shared process: its members' roles joined by ``+``."""
    return "+".join(m.role for m in members)
