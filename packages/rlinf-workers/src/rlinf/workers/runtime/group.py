"""`WorkerGroup`: launch N ranks of a `Worker` and fan method calls out to them.

The ranks are Ray actors when this process is connected to Ray (``ray.init``), else
processes of this machine (`rlinf.workers.runtime.local`: no Ray started at all).

Every wait has a deadline. A rank that dies (crash, ``os._exit``, SIGKILL, OOM killer)
turns the pending call into `WorkerDiedError` naming role, rank and node as soon as Ray
reports the death; a rank that does not answer in time turns it into `WorkerTimeoutError`
naming the missing ranks. The first failing rank fails the call at once: its peers may be
blocked in a collective waiting for it and would never finish.

Given a cluster discovered from the live Ray cluster, each rank is pinned (hard node
affinity) to the Ray node that owns its placement device; see `rlinf.workers.runtime.nodes`.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from rlinf.sched.cluster import Cluster
from rlinf.sched.placement import ComponentPlacement
from rlinf.workers.errors import (
    ConfigError,
    DispatchError,
    GroupClosedError,
    WorkerCallError,
    WorkerDiedError,
    WorkersError,
    WorkerTimeoutError,
)
from rlinf.workers.runtime import refs as call_refs
from rlinf.workers.runtime.allocator import DEFAULT_ALLOCATOR, HostAllocator, allocator_env
from rlinf.workers.runtime.context import WorkerContext, WorkerInfo, rank_devices
from rlinf.workers.runtime.dispatch import (
    ALL_TO_ALL,
    PER_RANK_ALL,
    RANK_ZERO,
    DispatchSpec,
    gather_results,
    split_arguments,
)
from rlinf.workers.runtime.interrupts import WAIT_SLICE_S, check_interrupted, keep_interrupts
from rlinf.workers.runtime.lazy_ray import connected, imported
from rlinf.workers.runtime.local import (
    AT_EXEC,
    LocalActor,
    LocalActorDied,
    LocalCallError,
    LocalRef,
    gpu_env,
    start_server,
)
from rlinf.workers.runtime.nodes import check_node_capacity, rank_node_ids
from rlinf.workers.runtime.ray_session import ClusterWatch, raylet_addresses, unreachable
from rlinf.workers.runtime.shared import SharedMember, SharedProcess, member_died, members_of
from rlinf.workers.runtime.worker import Worker

if TYPE_CHECKING:
    import ray
else:  # a run of local ranks never imports Ray
    from rlinf.workers.runtime.lazy_ray import ray

__all__ = ["GroupFuture", "WorkerGroup", "count_onloads"]

_log = structlog.get_logger(__name__)
_DETAIL_CHARS = 400
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _translate(
    exc: BaseException, *, role: str, rank: int, method: str, node: str | None,
    shared_with: tuple[str, ...] = (),
) -> BaseException:
    """Turn the backend's error for one rank's call (Ray's, or a local rank's) into ours
    (other errors pass through); a death
    of a process that `role` shares with others names them (any of them may have caused
    it)."""
    if isinstance(exc, LocalCallError):
        return WorkerCallError(role, rank, method=method, node=node, cause=exc.cause,
                               detail=f"{type(exc.cause).__name__}: {exc.cause}")
    ray_errors = imported("ray.exceptions")  # an error of Ray's only where Ray is imported
    if isinstance(exc, LocalActorDied) or (ray_errors is not None and isinstance(
            exc, ray_errors.RayActorError | ray_errors.WorkerCrashedError
            | ray_errors.OutOfMemoryError)):
        text = _ANSI.sub("", str(exc))
        if shared_with:
            text = f"its process, shared with {list(shared_with)}, died: {text}"
        if getattr(exc, "actor_init_failed", False):
            # The message ends with the constructor's traceback; its last line says why.
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            why = (lines[-1] if lines else "").removeprefix("its constructor raised ")
            return WorkerDiedError(role, rank, node=node, method="__init__",
                                   detail=f"its constructor raised {why}",
                                   shared_with=shared_with)
        detail = " ".join(text.split())[:_DETAIL_CHARS]
        return WorkerDiedError(role, rank, node=node, method=method, detail=detail,
                               shared_with=shared_with)
    if ray_errors is not None and isinstance(exc, ray_errors.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            detail = f"{type(cause).__name__}: {cause}"
            return WorkerCallError(role, rank, method=method, detail=detail, node=node,
                                   cause=cause)
        return WorkerCallError(role, rank, method=method, detail=str(exc), node=node)
    return exc


def _pinned_nodes(
    role: str, placement: ComponentPlacement | None, cluster: Cluster | None, *,
    cpus: float, gpus: float,
) -> tuple[str, ...] | None:
    """Ray node id per rank when `cluster` names Ray nodes, checked against the live cluster."""
    if cluster is None or all(node.ray_node_id is None for node in cluster.nodes):
        return None
    if placement is None:
        _log.warning("worker_group_not_pinned", role=role,
                      reason="cluster given without a placement: no devices to place by")
        return None
    live = [node for node in ray.nodes() if node.get("Alive")]
    alive = {str(node["NodeID"]): str(node.get("NodeManagerAddress", "")) for node in live}
    node_ids = rank_node_ids(placement, cluster, alive=alive)
    if node_ids is not None:
        totals = {str(node["NodeID"]): dict(node.get("Resources", {})) for node in live}
        check_node_capacity(role, node_ids, per_rank={"CPU": cpus, "GPU": gpus},
                            totals=totals)
    return node_ids


class GroupFuture:
    """The pending results of one group call (like a `Work` handle: `done`, `result`)."""

    def __init__(
        self, *, role: str, method: str, ranks: tuple[int, ...], refs: Sequence[ray.ObjectRef],
        spec: DispatchSpec, nodes: Mapping[int, str], default_timeout: float,
        raylets: Mapping[int, str] | None = None, shared_with: tuple[str, ...] = (),
    ) -> None:
        self._role = role
        self._shared_with = shared_with
        self._method = method
        self._ranks = ranks
        self._refs = list(refs)
        self._spec = spec
        self._nodes = dict(nodes)
        self._raylets = dict(raylets or {})
        self._default_timeout = default_timeout
        self._results: list[Any] | None = None

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks this call went to, in gather order."""
        return self._ranks

    @property
    def refs(self) -> tuple[ray.ObjectRef, ...]:
        """Ray object refs of the ranks' results (to ``ray.wait`` on several calls at once)."""
        return tuple(self._refs)

    def done(self) -> bool:
        """True when every rank has finished (successfully or not); never blocks."""
        if self._results is not None:
            return True
        ready, _ = call_refs.wait(self._refs, num_returns=len(self._refs), timeout=0)
        return len(ready) == len(self._refs)

    def rank_results(self, timeout: float | None = None) -> list[Any]:
        """One result per target rank, in order, waiting at most `timeout` seconds overall.

        Raises `WorkerDiedError`, `WorkerCallError` (the method raised),
        `WorkerTimeoutError`, or `ClusterLostError` once the Ray cluster stopped answering.
        `timeout=None` uses the group's call timeout, never infinity.
        """
        if self._results is not None:
            return list(self._results)
        limit = self._default_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        pending = {ref: i for i, ref in enumerate(self._refs)}
        results: list[Any] = [None] * len(self._refs)
        # A rank's death reaches this process through the GCS: with the cluster gone
        # (ray stop) its call would never end, and Ray would abort the process in a minute.
        # Local ranks report their own deaths: no cluster to watch.
        on_ray = not isinstance(self._refs[0], LocalRef) if self._refs else False
        watch = ClusterWatch() if on_ray else None
        with keep_interrupts():
            while pending:
                remaining = deadline - time.monotonic()
                ready: list[ray.ObjectRef] = []
                if remaining > 0:  # in slices: a swallowed Ctrl-C is raised again in time
                    ready, _ = call_refs.wait(list(pending), num_returns=1,
                                              timeout=min(WAIT_SLICE_S, remaining))
                    check_interrupted()
                    if watch is not None:
                        watch.check()
                if ready:
                    self._collect(ready, pending, results, remaining)
                elif time.monotonic() >= deadline:
                    missing = sorted(self._ranks[i] for i in pending.values())
                    raise WorkerTimeoutError(self._role, missing, method=self._method,
                                             timeout=limit)
        self._results = results
        return list(results)

    def died_with_a_node(self) -> WorkerDiedError | None:
        """A `WorkerDiedError` for the first unfinished rank whose node is lost (its raylet,
        recorded at launch, refuses connections), else None. Ray reports such a rank's death
        only once it declares the node dead, many seconds later; its peers fail at once (a
        collective's connection closed), and their errors would hide the cause."""
        if self._results is not None:
            return None
        ready, _ = call_refs.wait(self._refs, num_returns=len(self._refs), timeout=0)
        unfinished = [r for i, r in enumerate(self._ranks) if self._refs[i] not in ready]
        lost = unreachable({self._raylets[r] for r in unfinished if r in self._raylets})
        for rank in unfinished:
            if self._raylets.get(rank) in lost:
                return WorkerDiedError(self._role, rank, node=self._nodes.get(rank),
                                       method=self._method,
                                       detail="its Ray node was lost (the raylet stopped "
                                              "answering)")
        return None

    def _collect(self, ready: list[ray.ObjectRef], pending: dict[ray.ObjectRef, int],
                 results: list[Any], remaining: float) -> None:
        """Move the `ready` ranks' results from `pending` into `results`."""
        for ref in ready:
            index = pending.pop(ref)
            rank = self._ranks[index]
            try:
                results[index] = call_refs.get(ref, timeout=max(remaining, 0.0))
            except Exception as exc:
                raise _translate(exc, role=self._role, rank=rank, method=self._method,
                                 node=self._nodes.get(rank),
                                 shared_with=self._shared_with) from exc

    def result(self, timeout: float | None = None) -> Any:
        """The gathered result per the call's `DispatchSpec` (see `rank_results`)."""
        return gather_results(self._spec, self.rank_results(timeout))


class WorkerGroup:
    """N ranks of one `Worker` subclass running as Ray actors; build it with `launch`."""

    def __init__(
        self, *, role: str, name: str, worker_cls: type[Worker],
        actors: Sequence[ray.actor.ActorHandle], call_timeout: float,
        shared: _SharedProcesses | None = None,
    ) -> None:
        self._role = role
        self._name = name
        self._worker_cls = worker_cls
        self._actors = tuple(actors)
        self._call_timeout = call_timeout
        self._infos: tuple[WorkerInfo, ...] = ()
        self._raylets: dict[int, str] = {}
        """``host:port`` of each rank's raylet, recorded at launch (to tell a lost node)."""
        self._shared = shared
        """Set when the ranks are members of shared processes (`launch_shared`)."""
        self._closed = False

    @classmethod
    def launch(
        cls,
        worker_cls: type[Worker],
        *,
        role: str | None = None,
        num_ranks: int | None = None,
        placement: ComponentPlacement | None = None,
        cluster: Cluster | None = None,
        num_cpus_per_rank: float = 1.0,
        num_gpus_per_rank: float = 0.0,
        init_kwargs: Mapping[str, Any] | None = None,
        env_vars: Mapping[str, str] | None = None,
        allocator: HostAllocator = DEFAULT_ALLOCATOR,
        log_level: str = "INFO",
        device_lock_address: str | None = None,
        device_lock_token: bytes | None = None,
        memory_bytes: int | None = None,
        launch_timeout: float = 120.0,
        call_timeout: float = 600.0,
        span_devices: bool = False,
        trace: bool = False,
    ) -> WorkerGroup:
        """Start the ranks and wait (at most `launch_timeout`) until each is constructed.

        The rank count comes from `placement` (devices x processes per device) or
        `num_ranks`; each rank's `WorkerContext.devices` is its device in the placement
        (a CPU slot without GPUs). When `cluster` came from `Cluster.discover()` on the live
        Ray cluster (its nodes carry Ray node ids), rank r runs on the Ray node that owns its
        device, and a device the live cluster lacks raises `ConfigError` before any rank
        starts; without such a cluster Ray puts ranks wherever it has room. Ray reserves
        `num_cpus_per_rank` CPUs (fractions allowed) and `num_gpus_per_rank` GPUs per rank.
        `init_kwargs` go to the worker's ``__init__`` after its context; `env_vars` to its
        environment, with `allocator`'s (jemalloc keeping its pages unless the user chose
        an allocator: `rlinf.workers.runtime.allocator`). With
        `device_lock_address`/`device_lock_token` (an `rlinf.sched.DeviceLockServer`), ranks
        can `Worker.hold_devices` to time-share their devices with collocated components;
        `memory_bytes` is what the plan priced per device for this component, so the lock
        keeps it co-resident with components it fits beside (None: each worker's own
        `Worker.resident_memory_bytes`). `span_devices`: one rank whose context holds every
        device of `placement` (a process computing on all of them, e.g. with one thread per
        CPU slot), on the node of the first. `trace`: each rank's context asks it to record
        trace spans (`WorkerContext.trace`). Without ``ray.init()`` the ranks are local
        processes (`rlinf.workers.runtime.local`).
        """
        if not issubclass(worker_cls, Worker):
            raise ConfigError(f"{worker_cls!r} is not a subclass of rlinf.workers Worker")
        ranks = _Ranks.of(role or (placement.component if placement is not None else None),
                          num_ranks=num_ranks, placement=placement, cluster=cluster,
                          cpus=num_cpus_per_rank, gpus=num_gpus_per_rank,
                          span_devices=span_devices)
        name = f"{ranks.role}-{uuid.uuid4().hex[:8]}"
        start = ranks.starter(worker_cls, cpus=num_cpus_per_rank, gpus=num_gpus_per_rank,
                              env=_worker_env(allocator, env_vars))
        actors: list[Any] = [start(name, rank, ranks.context(
            name, rank, log_level=log_level, device_lock_address=device_lock_address,
            device_lock_token=device_lock_token, memory_bytes=memory_bytes, trace=trace),
            **dict(init_kwargs or {})) for rank in range(ranks.world)]
        group = cls(role=ranks.role, name=name, worker_cls=worker_cls, actors=actors,
                    call_timeout=call_timeout)
        group._started(launch_timeout)
        _log.info("worker_group_launched", role=ranks.role, group=name, world_size=ranks.world,
                  nodes=sorted({info.node_ip for info in group._infos}),
                  pinned=ranks.node_ids is not None)
        return group

    @classmethod
    def launch_shared(
        cls,
        members: Sequence[SharedMember],
        *,
        placement: ComponentPlacement,
        cluster: Cluster | None = None,
        num_cpus_per_rank: float = 1.0,
        num_gpus_per_rank: float = 0.0,
        env_vars: Mapping[str, str] | None = None,
        allocator: HostAllocator = DEFAULT_ALLOCATOR,
        log_level: str = "INFO",
        launch_timeout: float = 120.0,
        call_timeout: float = 600.0,
        span_devices: bool = False,
        trace: bool = False,
    ) -> dict[str, WorkerGroup]:
        """Start one process per rank of `placement` that serves every member
        (`rlinf.workers.runtime.shared`) and return a group per member, by role; each member
        sees the rank's devices as a group of its own would. Arguments as `launch`; the
        processes reserve `num_cpus_per_rank` and `num_gpus_per_rank` once for all members.
        A member's failing constructor raises its `WorkerDiedError` (method ``__init__``)
        after every process is killed."""
        if len(members) < 1 or len({m.role for m in members}) != len(members):
            raise ConfigError(f"a shared process needs members with distinct roles, got "
                              f"{[m.role for m in members]}")
        ranks = _Ranks.of(members_of(members), num_ranks=None, placement=placement,
                          cluster=cluster, cpus=num_cpus_per_rank, gpus=num_gpus_per_rank,
                          span_devices=span_devices)
        name = f"{ranks.role}-{uuid.uuid4().hex[:8]}"
        # Threads: a member waiting on a channel must not hold up the member feeding it;
        # `SharedProcess.call_member` keeps each member's calls one at a time.
        start = ranks.starter(SharedProcess, cpus=num_cpus_per_rank, gpus=num_gpus_per_rank,
                              env=_worker_env(allocator, env_vars),
                              max_concurrency=4 * len(members) + 4)
        actors: list[Any] = [start(name, rank, ranks.context(name, rank, log_level=log_level))
                             for rank in range(ranks.world)]
        host = cls(role=ranks.role, name=name, worker_cls=SharedProcess, actors=actors,
                   call_timeout=call_timeout)
        host._started(launch_timeout)
        shared = _SharedProcesses(host, {m.role for m in members})
        groups: dict[str, WorkerGroup] = {}
        deadline = time.monotonic() + launch_timeout
        for member in members:
            group = cls(role=member.role, name=f"{name}/{member.role}",
                        worker_cls=member.worker_cls, actors=actors,
                        call_timeout=call_timeout, shared=shared)
            group._infos, group._raylets = host._infos, dict(host._raylets)
            contexts = [ranks.context(group.name, rank, role=member.role, log_level=None,
                                      device_lock_address=member.device_lock_address,
                                      device_lock_token=member.device_lock_token,
                                      memory_bytes=member.memory_bytes,
                                      device_memory=member.device_memory, trace=trace)
                        for rank in range(ranks.world)]
            try:
                host.call_async("add_member", [member.worker_cls] * ranks.world, contexts,
                                [dict(member.init_kwargs)] * ranks.world, spec=PER_RANK_ALL
                                ).rank_results(max(deadline - time.monotonic(), 0.0))
            except WorkersError as exc:
                host.kill()
                raise member_died(member.role, exc) from exc
            groups[member.role] = group
        _log.info("worker_group_launched", role=ranks.role, group=name, world_size=ranks.world,
                  members=[m.role for m in members],
                  nodes=sorted({info.node_ip for info in host._infos}),
                  pinned=ranks.node_ids is not None)
        return groups

    def _started(self, timeout: float) -> None:
        """Wait until every rank is constructed and record where each runs (killing the
        group when one fails)."""
        try:
            infos = self.call_async("worker_info", spec=ALL_TO_ALL).rank_results(timeout)
        except WorkersError:
            self.kill()
            raise
        self._infos = tuple(infos)
        if not any(isinstance(actor, LocalActor) for actor in self._actors):
            raylets = raylet_addresses({info.node_id for info in infos})
        else:
            raylets = {}
        self._raylets = {info.rank: raylets[info.node_id] for info in infos
                         if info.node_id in raylets}

    @property
    def role(self) -> str:
        """The component the ranks implement."""
        return self._role

    @property
    def name(self) -> str:
        """Unique group name; rank r's Ray actor is named ``f"{name}-{r}"``."""
        return self._name

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self._actors)

    @property
    def actors(self) -> tuple[ray.actor.ActorHandle, ...]:
        """Ray actor handles by rank (to hand to other workers)."""
        return self._actors

    @property
    def infos(self) -> tuple[WorkerInfo, ...]:
        """Node and process of each rank, recorded at launch."""
        return self._infos

    def _resolve(
        self, method: str, spec: DispatchSpec | None
    ) -> tuple[DispatchSpec, tuple[int, ...]]:
        if self._closed:
            raise GroupClosedError(f"worker group {self._name!r} was shut down; launch a new one")
        if method.startswith("_") or not callable(getattr(self._worker_cls, method, None)):
            raise DispatchError(
                f"{self._worker_cls.__name__} has no public method {method!r}"
            )
        resolved = spec or self._worker_cls.dispatch.get(method, ALL_TO_ALL)
        ranks = resolved.ranks if resolved.ranks is not None else tuple(range(self.world_size))
        if not ranks or len(set(ranks)) != len(ranks) or not all(
            0 <= r < self.world_size for r in ranks
        ):
            raise DispatchError(f"target ranks {ranks} must be distinct ranks in "
                                f"[0, {self.world_size})")
        return resolved, ranks

    def call_async(
        self, method: str, *args: Any, spec: DispatchSpec | None = None, **kwargs: Any
    ) -> GroupFuture:
        """Start `method` on the target ranks and return a `GroupFuture` at once.

        `spec` overrides the method's entry in the worker class's `dispatch` (default:
        broadcast, gather all). ``spec`` and ``timeout`` are reserved keyword names.
        """
        resolved, ranks = self._resolve(method, spec)
        per_rank = split_arguments(resolved, args, kwargs, len(ranks))
        if self._shared is None:
            refs = [getattr(self._actors[rank], method).remote(*a, **kw)
                    for rank, (a, kw) in zip(ranks, per_rank, strict=True)]
        else:
            refs = [self._actors[rank].call_member.remote(self._role, method, *a, **kw)
                    for rank, (a, kw) in zip(ranks, per_rank, strict=True)]
        nodes = {info.rank: info.node_ip for info in self._infos}
        shared_with = (tuple(sorted(self._shared.roles - {self._role}))
                       if self._shared is not None else ())
        return GroupFuture(role=self._role, method=method, ranks=ranks, refs=refs,
                           spec=resolved, nodes=nodes, default_timeout=self._call_timeout,
                           raylets=self._raylets, shared_with=shared_with)

    def call(
        self, method: str, *args: Any, spec: DispatchSpec | None = None,
        timeout: float | None = None, **kwargs: Any,
    ) -> Any:
        """`call_async` then wait at most `timeout` (default: the group's call timeout)."""
        return self.call_async(method, *args, spec=spec, **kwargs).result(timeout)

    def init_process_group(self, *, backend: str = "gloo", timeout: float = 300.0) -> None:
        """Join all ranks into one torch.distributed default process group.

        Rank 0 opens the rendezvous store on a free port, then every rank joins at once.
        Use ``"gloo"`` on CPU and ``"nccl"`` with one GPU per rank.
        """
        addr, port = self.call("open_rendezvous", timeout_s=timeout, spec=RANK_ZERO,
                               timeout=timeout)
        self.call("init_process_group", master_addr=addr, master_port=port, backend=backend,
                  timeout_s=timeout, timeout=timeout)
        _log.info("worker_group_process_group", role=self._role, group=self._name,
                  backend=backend, world_size=self.world_size)

    @property
    def shares_processes(self) -> bool:
        """Whether the ranks are members of processes shared with other groups
        (`launch_shared`)."""
        return self._shared is not None

    def kill(self) -> None:
        """Kill every rank now (no cleanup hooks); idempotent. A member of shared processes
        kills them, with every other member."""
        if self._shared is not None:
            self._shared.kill()
            self._closed = True
            return
        for actor in self._actors:
            if isinstance(actor, LocalActor):
                actor.kill()
                continue
            try:
                ray.kill(actor, no_restart=True)
            except (ValueError, ray.exceptions.RayError):  # already gone
                continue
        if not self._closed:
            _log.info("worker_group_killed", role=self._role, group=self._name)
        self._closed = True

    def shutdown(self, *, timeout: float = 30.0) -> None:
        """Run each rank's `Worker.shutdown` hook (at most `timeout`), then kill the ranks."""
        if self._closed:
            return
        try:
            self.call("shutdown", timeout=timeout)
        except WorkersError as exc:
            _log.warning("worker_group_unclean_shutdown", role=self._role, group=self._name,
                         error=str(exc))
        if self._shared is not None:  # the processes go with their last member
            self._closed = True
            self._shared.leave(self._role)
            return
        self.kill()

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running"
        return f"WorkerGroup(role={self._role!r}, world_size={self.world_size}, {state})"


class _SharedProcesses:
    """The processes several member groups share: killed with their last member."""

    def __init__(self, host: WorkerGroup, members: set[str]) -> None:
        self.host = host
        self.roles = frozenset(members)
        """Every member the processes serve."""
        self.members = set(members)
        """The members not shut down yet."""

    def leave(self, role: str) -> None:
        self.members.discard(role)
        if not self.members:
            self.host.kill()

    def kill(self) -> None:
        self.members.clear()
        self.host.kill()


def _worker_env(allocator: HostAllocator, env_vars: Mapping[str, str] | None) -> dict[str, str]:
    return {**allocator_env(allocator, env_vars=env_vars), **(env_vars or {})}


@dataclass(frozen=True)
class _Ranks:
    """The ranks a launch starts: their count, devices and nodes (checked before any
    starts)."""

    role: str
    world: int
    placement: ComponentPlacement | None
    span_devices: bool
    node_ids: tuple[str, ...] | None
    on_ray: bool
    """Ranks are Ray actors (this process is connected to Ray), else local processes."""

    @classmethod
    def of(cls, role: str | None, *, num_ranks: int | None,
           placement: ComponentPlacement | None, cluster: Cluster | None, cpus: float,
           gpus: float, span_devices: bool) -> _Ranks:
        if not role:
            raise ConfigError("a group needs a role: pass role= or a placement")
        if placement is not None and not span_devices and num_ranks not in (
                None, placement.num_procs):
            raise ConfigError(f"num_ranks={num_ranks} contradicts placement "
                              f"{placement.to_spec()!r} ({placement.num_procs} ranks)")
        if span_devices and placement is None:
            raise ConfigError("span_devices needs a placement (the devices to span)")
        world = (1 if span_devices else placement.num_procs) if placement is not None \
            else num_ranks
        if world is None or world < 1:
            raise ConfigError(f"need num_ranks >= 1 or a placement, got num_ranks={num_ranks}")
        on_ray = connected()
        node_ids = (_pinned_nodes(role, placement, cluster, cpus=cpus, gpus=gpus) if on_ray
                    else None)
        if node_ids is not None and span_devices:
            node_ids = node_ids[:1]
        return cls(role, world, placement, span_devices, node_ids, on_ray)

    def context(self, name: str, rank: int, *, log_level: str | None, role: str | None = None,
                device_lock_address: str | None = None, device_lock_token: bytes | None = None,
                memory_bytes: int | None = None, device_memory: int | None = None,
                trace: bool = False) -> WorkerContext:
        placement = self.placement
        return WorkerContext(
            role=role or self.role, rank=rank,
            world_size=self.world,
            devices=(tuple(placement.devices) if self.span_devices and placement is not None
                     else rank_devices(placement, rank) if placement is not None
                     else (rank,)),
            group_name=name, log_level=log_level,
            device_lock_address=device_lock_address, device_lock_token=device_lock_token,
            memory_bytes=memory_bytes, device_memory=device_memory, trace=trace)

    def starter(self, cls: type, *, cpus: float, gpus: float, env: Mapping[str, str],
                max_concurrency: int | None = None) -> Callable[..., Any]:
        """``start(name, rank, *args, **kwargs)``: rank `rank` of `cls` built with the
        arguments, as a Ray actor reserving `cpus` and `gpus`, or as a local process seeing
        the rank's GPUs when `gpus` > 0 (`cpus` then reserves nothing: the plan's slots
        already divide the machine)."""
        if self.on_ray:
            remote_cls: Any = ray.remote(cls)
            extra = {} if max_concurrency is None else {"max_concurrency": max_concurrency}

            def on_ray(name: str, rank: int, *args: Any, **kwargs: Any) -> Any:
                options = self.actor_options(name, rank, cpus=cpus, gpus=gpus, env=env)
                return remote_cls.options(**options, **extra).remote(*args, **kwargs)
            return on_ray
        # What takes effect only when a process execs goes to the fork server, which every
        # rank is forked from (the first group's choice; a rank that wants other values is
        # started fresh). ``PYTHONPATH`` is not passed on: a rank has the driver's sys.path.
        start_server(env={key: value for key, value in env.items() if key in AT_EXEC})

        def local(name: str, rank: int, *args: Any, **kwargs: Any) -> Any:
            rank_env = {key: value for key, value in env.items() if key != "PYTHONPATH"}
            if gpus > 0:
                devices = (self.placement.devices if self.span_devices and self.placement
                           else rank_devices(self.placement, rank) if self.placement
                           else (rank,))
                rank_env.update(gpu_env(tuple(devices)))
            return LocalActor(cls, args, kwargs, name=f"{name}-{rank}", env=rank_env,
                              max_concurrency=max_concurrency or 1)
        return local

    def actor_options(self, name: str, rank: int, *, cpus: float, gpus: float,
                      env: Mapping[str, str]) -> dict[str, Any]:
        options: dict[str, Any] = {
            "name": f"{name}-{rank}", "num_cpus": cpus, "num_gpus": gpus,
            "max_restarts": 0, "max_task_retries": 0,
        }
        if env:
            options["runtime_env"] = {"env_vars": dict(env)}
        if self.node_ids is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node_id=self.node_ids[rank], soft=False)
        return options


def count_onloads(groups: Iterable[WorkerGroup], *, since: float, timeout: float) -> int:
    """Onloads the device lock ran in every rank of `groups` since Unix time `since`: the
    context switches a run performed, to compare with the simulator's count."""
    futures = [group.call_async("onloads_since", since) for group in groups]
    return sum(int(n) for future in futures for n in future.rank_results(timeout))
