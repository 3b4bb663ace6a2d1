"""`FlowRun`: a declared `MacroFlow` launched on an `ExecutionPlan`, run iteration by
iteration, and torn down.

`FlowRun.launch(flow, plan, inputs=..., trace=...)`: the declaration is a value; what one
run feeds it (a data source, a model folder) goes in as ``inputs`` — per component,
constructor arguments merged over the declared ones — and ``trace`` asks every rank to
record spans. Then:

1. one `WorkerGroup` per component on the plan's placement (devices × processes per device
   ranks, launched side by side; each rank reserves an equal share of the Ray cluster's
   CPUs, at most one, and on CUDA its share of a GPU) — except components the placement
   lets run inside their host (`ComponentSpec.inline_with`), which the host's process
   serves;
2. a `rlinf.sched.DeviceLockServer` when any device is shared by two processes — ranks
   hold their devices through it around every unit of work (`FlowWorker.turn`); given the
   cluster's device memory it keeps components that fit together resident and
   onloads/offloads the others;
3. one channel per declared edge (loop edges included; none between an inlined component
   and its host), created by rank 0 of the consuming group;
4. torch.distributed groups for ``distributed`` components with several ranks, then each
   component's ``setup`` method;
5. the weight-sync path of every `WeightSyncSpec` and one initial sync.

`step(k)` starts every component's entry call at once (the components stream to each
other through their channels, loops included; the driver passes only a `StepContext` and
the channel descriptions), waits for all of them, syncs weights, and returns an
`IterationRecord` of named, timed phases (`rlinf.workers.flow.records`; an inlined
component's phase is its host's time spent on it). Every wait has a deadline; the first
rank that dies, raises or times out fails the step at once — a dead rank as
`WorkerDiedError` naming it, even when a peer noticed first (a producer whose consumer died
sees its channel vanish) — and the flow is then killed and closed, as on KeyboardInterrupt.
`close()` stops every group, channel, the lock server, the rendezvous store, and Ray if the
run started it.

With the declaration's ``policy_lag=1`` (off by default) the trainers — the senders of
weight syncs — run one iteration behind: `step(k)` runs every other component on iteration
k while the trainers train on iteration k-1's data (which waited in their input channels),
then syncs. Where the plan gives trainers devices of their own, the next rollout overlaps
the update; the generators act with weights one update old, which the trainer corrects for
(e.g. PPO's importance ratio against the behaviour policy). `drain()` trains the data still
waiting, alone, so that a checkpoint taken after it holds no iteration in flight
(`iteration(k, drain=True)` does both).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING, Any

import structlog

from rlinf.comm import TCPStore, new_token
from rlinf.sched import Cluster, ExecutionMode, ExecutionPlan, Placement, Profile
from rlinf.workers.errors import ClusterLostError, ConfigError, WorkerDiedError, WorkersError
from rlinf.workers.flow.channels import FlowChannel, store_name
from rlinf.workers.flow.context import StepContext
from rlinf.workers.flow.declaration import ComponentSpec, MacroFlow
from rlinf.workers.flow.errors import FlowClosedError, FlowDeclarationError
from rlinf.workers.flow.records import (
    EDGE_BYTES,
    IterationRecord,
    PhaseRecord,
    edge_bytes_per_item,
    iteration_metrics,
    profile_of,
)
from rlinf.workers.flow.weights import WeightSync, weight_transport
from rlinf.workers.flow.worker import EntryReport
from rlinf.workers.runtime import RANK_ZERO, GroupFuture, WorkerGroup, count_onloads
from rlinf.workers.runtime import refs as call_refs
from rlinf.workers.runtime.backend import start_runtime
from rlinf.workers.runtime.interrupts import (
    WAIT_SLICE_S,
    check_interrupted,
    hold_interrupts,
    keep_interrupts,
)
from rlinf.workers.runtime.lazy_ray import connected
from rlinf.workers.runtime.ray_session import (
    ClusterWatch,
    cluster_address,
    cluster_reachable,
    stop_ray,
)
from rlinf.workers.runtime.shared import SharedMember
from rlinf.workers.runtime.worker import LOCAL_LOCK

if TYPE_CHECKING:
    import ray
else:  # imported on use: a run of local ranks never needs it
    from rlinf.workers.runtime.lazy_ray import ray
from rlinf.workers.telemetry import Span

__all__ = ["FlowRun"]

_log = structlog.get_logger(__name__)

_DEATH_GRACE_S = 5.0
"""After a rank fails, how long to look for a dead peer that explains the failure."""


class FlowRun:
    """The launched groups of one flow and the driver of its iterations (module docstring)."""

    def __init__(self, flow: MacroFlow, plan: ExecutionPlan, *, groups: Mapping[str, WorkerGroup],
                 channels: Mapping[str, FlowChannel], lock: Any, store: TCPStore,
                 owns_ray: bool, timeout: float,
                 local_takers: frozenset[str] = frozenset()) -> None:
        self.flow = flow
        self.plan = plan
        self.timeout = timeout
        self.inlined = flow.inlined(plan.placement)
        """``{component: host}``: components served inside their host's process."""
        self._groups = dict(groups)
        self._channels = dict(channels)
        self._syncs: list[WeightSync] = []
        self._lock = lock
        self._local_lock = local_takers
        """Components that take turns through their process's in-process lock."""
        self._store = store
        """The rendezvous store channels are found through (this process serves it)."""
        self._owns_ray = owns_ray
        self._records: list[IterationRecord] = []
        self._trainers = frozenset(flow.trainers)
        self._pending: StepContext | None = None
        """With a policy lag: the iteration whose data awaits the trainers."""
        self._closed = False

    # -- launch ----------------------------------------------------------------------------

    @classmethod
    def launch(cls, flow: MacroFlow, plan: ExecutionPlan, *, cluster: Cluster | None = None,
               timeout: float = 600.0, log_level: str = "WARNING",
               stop_ray: bool | None = None, cpus_per_rank: float | None = None,
               inputs: Mapping[str, Mapping[str, Any]] | None = None,
               trace: bool = False) -> FlowRun:
        """Start `flow` where `plan` places it (see the module docstring). `inputs`: this
        run's constructor arguments per component, over the declared ``init_kwargs`` (a
        component served inside its host takes none: its host builds it). `trace`: every
        rank records trace spans (`drain_spans`). Ray is started if
        this process has not initialised it, and stopped at `close` if this launch started
        it (`stop_ray` decides otherwise). `cluster` (from `rlinf.sched.Cluster.discover()`
        on the live Ray cluster) pins each rank to its device's node. `timeout` bounds every
        wait (launch, each call, each step). `cpus_per_rank`: the Ray CPUs each rank
        reserves (default: an equal share of the cluster's, so one flow fills it; less lets
        several flows run side by side). Every worker allocates host memory with
        ``flow.host_allocator``."""
        placement = _checked_placement(flow, plan.placement)
        _check_policy_lag(flow, placement)
        _check_peer_ends(flow, placement)
        inlined = flow.inlined(placement)
        run_inputs = _checked_inputs(flow, inputs, inlined=inlined)
        _check_gpus(flow)
        if timeout <= 0:
            raise ConfigError(f"timeout must be > 0, got {timeout}")
        started = start_runtime(sorted({spec.worker.__module__ for spec in flow.components}))
        owns_ray = started if stop_ray is None else stop_ray
        run_id = uuid.uuid4().hex[:8]
        token = new_token()
        groups: dict[str, WorkerGroup] = {}
        lock: Any = None
        rendezvous: TCPStore | None = None
        try:
            # Where the channels and endpoints are found: a store served by this process (no
            # Ray actor to start), on this node's address so ranks on other nodes reach it.
            rendezvous = TCPStore.serve(host=_node_address(), token=token)
            store = store_name(f"rlinf-flow-{run_id}", rendezvous.address)
            options: dict[str, Any] = {
                "env_vars": {"RLINF_COMM_TOKEN": token.hex(), **_driver_path()},
                "allocator": flow.host_allocator,
                "log_level": log_level,
                "launch_timeout": timeout, "call_timeout": timeout, "cluster": cluster,
                "trace": trace}
            locked = _lock_takers(placement, inlined=inlined)
            in_process = _in_process_takers(flow, placement, locked)
            lock_options: dict[str, dict[str, Any]] = {}
            if locked - in_process:
                from rlinf.sched import DeviceLockServer

                # Device memory lets the lock keep components that fit together resident
                # (the simulator's switch rule); unknown, it evicts at every change of holder.
                lock = DeviceLockServer(
                    token=token, num_devices=placement.num_devices,
                    device_memory=cluster.device_memory() if cluster is not None else None)
                host, port = lock.address
                lock_options.update({name: {"device_lock_address": f"{host}:{port}",
                                            "device_lock_token": token}
                                     for name in locked - in_process})
            memory = cluster.device_memory() if cluster is not None else {}
            lock_options.update({name: {
                "device_lock_address": f"{LOCAL_LOCK}{run_id}", "device_lock_token": token,
                "device_memory": min((memory[d] for d in placement.devices_of(name)
                                      if d in memory), default=None)}
                for name in in_process})
            _launch_groups(flow, placement, options, inlined=inlined, into=groups,
                           cpus_per_rank=cpus_per_rank, lock_options=lock_options,
                           inputs=run_inputs)
            channels = {c.key: FlowChannel(
                src=c.edge.src, dst=c.edge.dst, name=f"{run_id}/{c.key}", store=store,
                consumer_ranks=groups[c.edge.dst].world_size,
                producer_ranks=groups[c.edge.src].world_size,
                sharding=flow.component(c.edge.dst).worker.input_sharding,
                unit=flow.unit_of(c), items_per_message=int(plan.granularity.get(
                    c.key, c.granularity or flow.unit_of(c))), transport=c.transport)
                for c in flow.channels
                if c.edge.src not in inlined and c.edge.dst not in inlined}
            run = cls(flow, plan, groups=groups, channels=channels, lock=lock,
                      store=rendezvous, owns_ray=owns_ray, timeout=timeout,
                      local_takers=in_process)
        except BaseException:
            for group in groups.values():
                group.kill()
            _await_exit(groups.values(), timeout=min(timeout, 30.0))
            _stop(lock, rendezvous, owns_ray)
            raise
        try:
            # Every rank's endpoint exists before anyone sends to it (p2p edges address
            # endpoints by name), then each consumer creates its channels.
            run._wait({name: group.call_async("join_store", store)
                       for name, group in groups.items()})
            run._wait({f"{c.dst}<-{c.src}": groups[c.dst].call_async(
                "create_channel", c, spec=RANK_ZERO) for c in channels.values()
                if c.transport == "channel"})
            launched = [s for s in flow.components if s.name in groups]
            for spec in launched:
                group = groups[spec.name]
                if spec.distributed and group.world_size > 1:
                    group.init_process_group(backend="nccl" if flow.device == "cuda" else "gloo",
                                             timeout=timeout)
            run._wait({s.name: groups[s.name].call_async(s.setup) for s in launched
                       if s.setup is not None})
            for sync in flow.weight_syncs:
                src = inlined.get(sync.src, sync.src)
                # An inlined receiver's weights load into its host (once, even if both are).
                dst = [d for d in dict.fromkeys(inlined.get(d, d) for d in sync.dst) if d != src]
                sender, receivers = groups[src], [groups[d] for d in dst]
                transport = weight_transport(sender, receivers, placement=placement,
                                             on_gpu=flow.device == "cuda", wanted=sync.transport)
                whole = (sender.world_size == 1 or not callable(getattr(
                    flow.component(src).worker, "full_weights_on_every_rank", None))
                    or bool(sender.call("full_weights_on_every_rank", spec=RANK_ZERO)))
                run._syncs.append(WeightSync(sender, receivers, transport=transport,
                                             wait=run._wait, in_process=whole))
            for weight_sync in run._syncs:
                weight_sync.join()
                weight_sync.sync()
        except BaseException:
            run.close(kill=True)
            raise
        _log.info("flow_launched", flow=flow.name, placement=placement.to_spec(),
                  mode=placement.mode.value, lock=lock is not None, inlined=inlined,
                  ranks={n: g.world_size for n, g in groups.items()},
                  weight_sync=[s.transport for s in run._syncs])
        return run

    # -- iterations ------------------------------------------------------------------------

    @property
    def groups(self) -> Mapping[str, WorkerGroup]:
        """The worker group of each launched component (for control calls: checkpoints,
        probes); an inlined component has none (its host's group serves it)."""
        return dict(self._groups)

    def group_of(self, name: str) -> WorkerGroup:
        """The group whose processes serve component `name` (its host's when inlined)."""
        return self._groups[self.inlined.get(name, name)]

    @property
    def channels(self) -> Mapping[str, FlowChannel]:
        """The channel of each edge ``"src->dst"``."""
        return dict(self._channels)

    @property
    def records(self) -> tuple[IterationRecord, ...]:
        """Every iteration run so far."""
        return tuple(self._records)

    @property
    def closed(self) -> bool:
        """Whether the run is closed (after `close` or a failed step)."""
        return self._closed

    @property
    def uses_device_lock(self) -> bool:
        """Whether components share devices through a device lock (a lock server, or the
        in-process lock of the components of a shared process)."""
        return self._lock is not None or bool(self._local_lock)

    @property
    def weight_transports(self) -> tuple[str, ...]:
        """The transport of each weight-sync edge, in declaration order."""
        return tuple(s.transport for s in self._syncs)

    def context(self, step: int, *, global_batch: int | None = None) -> StepContext:
        """The `StepContext` of iteration `step` (at `global_batch` items; default declared)."""
        placement = self.plan.placement
        return StepContext(
            step=step, items=self.flow.items(global_batch),
            ranks={n: self.group_of(n).world_size for n in self.flow.names},
            placement=placement, micro_batch=dict(self.plan.micro_batch),
            sources=tuple(n for n in self.flow.names if not self.flow.inputs(n)),
            loop_steps=self.flow.loop_steps, inlined=dict(self.inlined))

    @property
    def policy_lag(self) -> int:
        """Iterations the trainers run behind the other components (the flow's: 0 or 1)."""
        return self.flow.policy_lag

    @property
    def pending_step(self) -> int | None:
        """With a policy lag: the iteration whose data the trainers have not trained on yet
        (`drain` trains it); None when nothing waits."""
        return None if self._pending is None else self._pending.step

    def step(self, step: int, *, global_batch: int | None = None) -> IterationRecord:
        """Run iteration `step` (at `global_batch` items; default: the declared batch), then
        sync weights. With ``policy_lag=1`` the trainers train on the previous iteration's
        data meanwhile (none on the first step after launch or `drain`). Any failure kills
        and closes the flow before it propagates."""
        self._check_open()
        ctx = self.context(step, global_batch=global_batch)
        for channel in self._channels.values():
            channel.check_shards(ctx.items[channel.dst])
        launched = [name for name in self.flow.names if name in self._groups]
        if not self.policy_lag:
            contexts = {name: ctx for name in launched}
        else:
            contexts = {name: ctx for name in launched if name not in self._trainers}
            if self._pending is not None:
                contexts.update({name: self._pending for name in self._trainers})
        record = self._guarded(contexts, step)
        if self.policy_lag:
            self._pending = ctx
        return record

    def iteration(self, step: int, *, drain: bool = False) -> tuple[IterationRecord, ...]:
        """`step(step)`'s record, then with `drain` the record of `drain()` where it trained
        something (an app's iteration that ends at a checkpoint)."""
        record = self.step(step)
        tail = self.drain() if drain else None
        return (record,) if tail is None else (record, tail)

    def drain(self) -> IterationRecord | None:
        """With a policy lag: train on the data still waiting (the last `step`'s), alone,
        then sync weights; None when nothing waits. Call it before a checkpoint and after
        the last step, so that no iteration is left in flight."""
        self._check_open()
        if self._pending is None:
            return None
        pending, self._pending = self._pending, None
        return self._guarded({name: pending for name in self._trainers}, pending.step)

    def _guarded(self, contexts: Mapping[str, StepContext], step: int) -> IterationRecord:
        """`_step`, closing the flow when it raises (see `step`)."""
        try:
            with keep_interrupts():
                return self._step(contexts, step)
        except BaseException as exc:
            # A second Ctrl-C must not cut the teardown short (one during `cluster_reachable`
            # would leave the flow running); the first one is raised below.
            with hold_interrupts(reraise=not isinstance(exc, KeyboardInterrupt)):
                # A worker death may be the whole cluster's (ray stop): then say so, and
                # skip the calls to it, each of which would wait a minute for an answer.
                lost = isinstance(exc, ClusterLostError) or not cluster_reachable()
                self.close(kill=True, cluster_lost=lost)
            if lost and isinstance(exc, WorkersError) and not isinstance(exc, ClusterLostError):
                raise ClusterLostError(cluster_address(), detail=str(exc)) from exc
            raise

    def _step(self, contexts: Mapping[str, StepContext], step: int) -> IterationRecord:
        """The entries of the launched components in `contexts` (each on its context), then
        the weight syncs of the trainers among them (`_guarded` closes the flow when this
        raises)."""
        t0 = time.perf_counter()
        called = [s for s in self.flow.components if s.name in contexts]
        futures = {spec.name: self._groups[spec.name].call_async(
            "run_entry", spec.entry, contexts[spec.name],
            inputs=self._channels_of(spec.name, "src"),
            outputs=self._channels_of(spec.name, "dst")) for spec in called}
        reports, finished = self._wait_timed(futures, t0)
        hosts = {spec.name: self.inlined.get(spec.name, spec.name) for spec in self.flow.components}
        phases = [self._phase(spec, reports[hosts[spec.name]], contexts[hosts[spec.name]],
                              finished[hosts[spec.name]])
                  for spec in self.flow.components if hosts[spec.name] in contexts]
        trained = sorted({contexts[name].step for name in self._trainers if name in contexts})
        for sync in self._syncs:
            if sync.sender.role not in contexts:
                continue  # its trainer did not run: its weights have not changed
            started = time.perf_counter() - t0
            seconds = sync.sync()
            phases.append(PhaseRecord(f"weight_sync:{sync.sender.role}", started,
                                      started + seconds, seconds))
        seconds = time.perf_counter() - t0
        rank_metrics = {name: tuple(r.metrics for r in reports[name]) for name in reports}
        record = IterationRecord(step=step, seconds=seconds, phases=tuple(phases),
                                 metrics=iteration_metrics(phases, rank_metrics, seconds=seconds),
                                 rank_metrics=rank_metrics,
                                 trained_step=trained[0] if trained else None)
        self._records.append(record)
        return record

    def drain_spans(self) -> list[Span]:
        """Trace spans every rank recorded since the last drain (workers launched with
        ``trace=True``), device-lock switches included, in time order."""
        self._check_open()
        futures = [group.call_async("drain_spans") for group in self._groups.values()]
        spans = [s for future in futures for rank in future.rank_results(timeout=self.timeout)
                 for s in rank]
        return sorted(spans, key=lambda s: (s.start, s.track))

    def onloads(self, *, since: float) -> int:
        """Onloads the device lock ran in every rank since Unix time `since` (the context
        switches the run performed, to compare with the simulator's count)."""
        self._check_open()
        return count_onloads(self._groups.values(), since=since, timeout=self.timeout)

    def sync_weights(self) -> float:
        """Sync every weight-sync edge now (e.g. after loading a checkpoint); seconds taken."""
        self._check_open()
        try:
            return sum(sync.sync() for sync in self._syncs)
        except BaseException:
            self.close(kill=True)
            raise

    def profile(self, *, skip: int = 0) -> Profile:
        """The measurements of every iteration but the first `skip` (warm-up), plus every
        onload/offload, as an `rlinf.sched.Profile` (`rlinf.workers.flow.records`), with
        each channel's measured bytes per item in its metadata (`EDGE_BYTES`)."""
        records = self._records[skip:]
        sent = edge_bytes_per_item(records, self.flow.to_sched_workflow())
        return profile_of(records, metadata={
            "flow": self.flow.name, "placement": self.plan.spec,
            **({EDGE_BYTES: sent} if sent else {})}, loop_steps=self.flow.loop_steps)

    def _channels_of(self, name: str, peer_end: str) -> dict[str, FlowChannel]:
        """`name`'s launched channels keyed by the peer: its inputs (`peer_end` ``"src"``)
        or its outputs (``"dst"``)."""
        own_end = "dst" if peer_end == "src" else "src"
        return {getattr(c, peer_end): c for c in self._channels.values()
                if getattr(c, own_end) == name}

    def _phase(self, spec: ComponentSpec, reports: list[EntryReport], ctx: StepContext,
               ended: float) -> PhaseRecord:
        """`spec`'s phase from the reports of the ranks that served it (its host's when
        inlined: the host's time on it, its memory; the lock and switches stay the host's)."""
        peak = max(reports, key=lambda r: r.peak_memory_bytes)
        hosted = spec.name in self.inlined
        return PhaseRecord(
            name=spec.name, started=0.0, ended=ended,
            busy_seconds=max(r.busy_by_component.get(spec.name, 0.0) for r in reports),
            items=ctx.items[spec.name],
            num_devices=len(self.plan.placement.devices_of(spec.name)),
            peak_memory_bytes=peak.peak_memory_bytes, memory_source=peak.memory_source,
            lock_holds=0 if hosted else sum(r.lock_holds for r in reports),
            switches=() if hosted else tuple(s for r in reports for s in r.switches),
            calls=tuple((items, devices, seconds) for r in reports
                        for component, items, devices, seconds in r.calls
                        if component == spec.name),
            sent={} if hosted else _summed_sent(reports))

    # -- waiting -----------------------------------------------------------------------------

    def _wait(self, futures: Mapping[str, GroupFuture]) -> dict[str, list[Any]]:
        return self._wait_timed(futures, time.perf_counter())[0]

    def _wait_timed(self, futures: Mapping[str, GroupFuture], t0: float
                    ) -> tuple[dict[str, list[Any]], dict[str, float]]:
        """Every future's per-rank results and when each finished (seconds after `t0`).

        The first failing rank fails the call at once — its peers may be blocked on
        channels for it — preferring a dead rank's `WorkerDiedError` over the errors its
        peers saw because of it."""
        owner = {ref: name for name, future in futures.items() for ref in future.refs}
        left = {name: len(future.refs) for name, future in futures.items()}
        finished: dict[str, float] = {}
        pending = list(owner)
        watch = ClusterWatch()  # a cluster gone under the call: Ray alone would hang a minute
        deadline = time.monotonic() + self.timeout
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                late = sorted({owner[ref] for ref in pending})
                futures[late[0]].rank_results(timeout=0.0)  # raises WorkerTimeoutError
            ready, pending = call_refs.wait(pending, num_returns=1,
                                            timeout=min(WAIT_SLICE_S, remaining))
            check_interrupted()
            watch.check()
            for ref in ready:
                name = owner[ref]
                try:
                    call_refs.get(ref, timeout=0)
                except Exception:
                    raise self._failure(futures, name, pending, owner) from None
                left[name] -= 1
                if not left[name]:
                    finished[name] = time.perf_counter() - t0
        return ({name: future.rank_results(timeout=self.timeout)
                 for name, future in futures.items()}, finished)

    def _failure(self, futures: Mapping[str, GroupFuture], name: str, pending: list[Any],
                 owner: Mapping[Any, str]) -> BaseException:
        error = _error_of(futures[name])
        if isinstance(error, WorkerDiedError):
            return error
        deadline = time.monotonic() + _DEATH_GRACE_S
        while pending:
            # A rank on a lost node fails its peers at once, but Ray says it died only
            # once it declares the node dead: look at the nodes of the ranks not done.
            for late in sorted({owner[ref] for ref in pending}):
                died = futures[late].died_with_a_node()
                if died is not None:
                    return died
            if time.monotonic() >= deadline:
                break
            ready, pending = call_refs.wait(
                pending, num_returns=1, timeout=min(WAIT_SLICE_S, deadline - time.monotonic()))
            for ref in ready:
                other = _error_of(futures[owner[ref]])
                if isinstance(other, WorkerDiedError):
                    return other
        return error

    # -- lifecycle ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise FlowClosedError("this FlowRun is closed (after close() or a failed step); "
                                  "launch a new one")

    def close(self, *, kill: bool = False, cluster_lost: bool = False) -> None:
        """Stop every group (`kill`: at once, without shutdown hooks — for ranks that may be
        stuck), the device lock, the channel store, and Ray if the run started it.
        `cluster_lost`: the Ray cluster is gone with every worker and the store, and a call
        to it would wait a minute for an answer: only this process's own parts stop. A
        `kill` after a failure checks that itself (a failure outside `step` may be the
        cluster's too), and every wait on the cluster here ends early once it is gone."""
        if self._closed:
            return
        with hold_interrupts():  # a Ctrl-C in the teardown would leave ranks running
            self._close(kill=kill, cluster_lost=cluster_lost)

    def _close(self, *, kill: bool, cluster_lost: bool) -> None:
        self._closed = True
        cluster_lost = cluster_lost or (kill and not cluster_reachable())
        if not cluster_lost:
            for group in self._groups.values():
                with contextlib.suppress(Exception):
                    if kill:
                        group.kill()
                    else:
                        group.shutdown(timeout=min(self.timeout, 30.0))
            _await_exit(self._groups.values(), timeout=min(self.timeout, 30.0))
        _stop(self._lock, None if cluster_lost else self._store, self._owns_ray)
        _log.info("flow_closed", flow=self.flow.name, killed=kill)

    def __enter__(self) -> FlowRun:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(kill=exc is not None)


def _summed_sent(reports: Sequence[EntryReport]) -> dict[str, tuple[float, int]]:
    """``{edge: (weight, bytes)}`` over every rank's report."""
    out: dict[str, tuple[float, int]] = {}
    for report in reports:
        for edge, (weight, nbytes) in report.sent.items():
            before = out.get(edge, (0.0, 0))
            out[edge] = (before[0] + weight, before[1] + nbytes)
    return out


def _error_of(future: GroupFuture) -> BaseException:
    """The translated error of a call that has failed (`GroupFuture.rank_results` raises it)."""
    try:
        future.rank_results(timeout=_DEATH_GRACE_S)
    except WorkersError as exc:
        return exc
    except Exception as exc:  # not translated: keep it as it is
        return exc
    return ConfigError(f"{future!r} reported a failure but every rank answered")


def _lock_takers(placement: Placement, *, inlined: Mapping[str, str]) -> frozenset[str]:
    """The launched components that take turns through the device lock: those with a device
    another launched component also runs on. A component alone on its devices never waits,
    so its calls skip the lock's two round trips (one grant, one release per turn, on the
    critical path of every hand-over)."""
    takers: set[str] = set()
    for device in placement.used_devices:
        sharing = set(placement.sharing(device)) - set(inlined)
        if len(sharing) > 1:
            takers |= sharing
    return frozenset(takers)


def _in_process_takers(flow: MacroFlow, placement: Placement, locked: frozenset[str]
                       ) -> frozenset[str]:
    """The lock takers that take turns in-process (`rlinf.sched.LocalDeviceLock`): the
    members of a shared process whose devices no other process uses."""
    sets = flow.process_sets(placement)
    out: set[str] = set()
    for members in sets:
        if len(members) < 2 or not set(members) & locked:
            continue
        mine = set(placement.devices_of(members[0]))
        if not any(mine & set(placement.devices_of(other[0])) for other in sets
                   if other is not members):
            out |= set(members) & locked
    return frozenset(out)


def _launch_groups(flow: MacroFlow, placement: Placement, options: Mapping[str, Any], *,
                   inlined: Mapping[str, str], into: dict[str, WorkerGroup],
                   cpus_per_rank: float | None = None,
                   lock_options: Mapping[str, Mapping[str, Any]] | None = None,
                   inputs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Launch the processes of every component not `inlined`, one set of processes per
    `MacroFlow.process_sets` entry (components on the same devices share them), the sets
    side by side (each waits seconds for its processes; a host gets its guests'
    ``inline_kwargs``); every group that started lands in `into`, also when another failed
    or Ctrl-C came, so the caller can kill them all. A component in `lock_options` also gets
    its device lock's address and token, and one in `inputs` those constructor arguments
    over its declared ones."""
    sets = flow.process_sets(placement)
    cpus = (cpus_per_rank if cpus_per_rank is not None
            else _cpus_per_rank(placement, process_sets=sets, cluster=options.get("cluster")))
    locks = lock_options or {}

    def kwargs(spec: ComponentSpec) -> dict[str, Any]:
        merged = dict(spec.init_kwargs)
        for guest, host in inlined.items():
            if host == spec.name:
                merged.update(flow.component(guest).inline_kwargs)
        merged.update((inputs or {}).get(spec.name, {}))
        return merged

    def launch(members: tuple[str, ...]) -> dict[str, WorkerGroup]:
        gpus = _gpus_per_rank(flow, members, placement, inlined=inlined, process_sets=sets)
        if len(members) == 1:  # a process of its own never takes turns in-process
            spec = flow.component(members[0])
            return {spec.name: WorkerGroup.launch(
                spec.worker, placement=placement.components[spec.name],
                num_cpus_per_rank=cpus, num_gpus_per_rank=gpus, init_kwargs=kwargs(spec),
                span_devices=spec.one_process, **options, **locks.get(spec.name, {}))}
        shared = [SharedMember(flow.component(name).worker, name, kwargs(flow.component(name)),
                               **locks.get(name, {})) for name in members]
        return WorkerGroup.launch_shared(shared, placement=placement.components[members[0]],
                                         num_cpus_per_rank=cpus, num_gpus_per_rank=gpus,
                                         **options)

    with ThreadPoolExecutor(max_workers=len(sets)) as pool:
        pending = [pool.submit(launch, members) for members in sets]
        try:
            for future in pending:
                future.exception()  # wait for all: the groups that start must be known
        finally:
            pool.shutdown(wait=True)
            for future in pending:
                if future.done() and not future.cancelled() and future.exception() is None:
                    into.update(future.result())
    for future in pending:
        error = future.exception()
        if error is not None:
            raise error


def _check_peer_ends(flow: MacroFlow, placement: Placement) -> None:
    """Each p2p edge's rank counts divide, checked before anything starts (a rank per
    process of the component's devices, one for a component that spans them)."""
    inlined = flow.inlined(placement)

    def ranks(name: str) -> int:
        return 1 if flow.component(name).one_process else placement.components[name].num_procs

    for channel in flow.channels:
        if channel.transport != "p2p" or {channel.edge.src, channel.edge.dst} & set(inlined):
            continue
        counts = {end: ranks(end) for end in (channel.edge.src, channel.edge.dst)}
        few, many = sorted(counts.values())
        if many % few:
            raise FlowDeclarationError(
                f"channel {channel.edge} is p2p, which pairs the ranks of its ends only where "
                f"one count divides the other, but the plan gives them {counts} ranks: place "
                "them on device counts that divide, or declare the edge with "
                "transport='channel'")


def _check_gpus(flow: MacroFlow) -> None:
    """A flow that computes on CUDA is refused before anything starts where there is no GPU
    (a rank would die building its model, after the others started)."""
    if flow.device != "cuda" and not any(spec.num_gpus for spec in flow.components):
        return
    if connected():
        gpus, where = ray.cluster_resources().get("GPU", 0.0), "the Ray cluster has"
    else:
        gpus = sum(d.is_gpu for d in Cluster.discover(use_ray=False).devices)
        where = "this machine has"
    if gpus < 1:
        raise ConfigError(f"flow {flow.name!r} computes on CUDA, but {where} {gpus:g} GPUs "
                          "(nvidia-ml-py or Ray sees none): run on a machine with a GPU and its "
                          "driver (Ray started there detects it), or use device='cpu'")


def _checked_inputs(flow: MacroFlow, inputs: Mapping[str, Mapping[str, Any]] | None, *,
                    inlined: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """`inputs` as plain dicts, each naming a launched component (checked before anything
    starts)."""
    loose = sorted(str(name) for name, kwargs in (inputs or {}).items()
                   if not isinstance(kwargs, Mapping))
    if loose:
        raise FlowDeclarationError(
            f"inputs for {loose} are not mappings of constructor arguments: give each "
            "component a dict, e.g. inputs={'rollout': {'problems': source}}")
    checked = {name: dict(kwargs) for name, kwargs in (inputs or {}).items()}
    unknown = sorted(set(checked) - set(flow.names))
    if unknown:
        raise FlowDeclarationError(f"inputs name {unknown}, which the flow does not declare "
                                   f"(its components: {list(flow.names)})")
    served = sorted(name for name in checked if name in inlined and checked[name])
    if served:
        raise FlowDeclarationError(
            f"inputs go to {served}, but the plan serves them inside "
            f"{sorted({inlined[n] for n in served})}'s process, which builds them from their "
            "declared inline_kwargs: give the input to the host, or place them apart")
    return checked


def _check_policy_lag(flow: MacroFlow, placement: Placement) -> None:
    """A lagged flow's trainers run in processes of their own under this placement (the
    declaration checked the rest)."""
    if not flow.policy_lag:
        return
    trainers = set(flow.trainers)
    together = sorted(f"{guest} in {host}" for guest, host in flow.inlined(placement).items()
                      if (guest in trainers) != (host in trainers))
    if together:
        raise FlowDeclarationError(
            f"policy_lag=1 overlaps trainers with the other components, but the plan serves "
            f"{together} in one process: place them apart or use policy_lag=0")


def _checked_placement(flow: MacroFlow, placement: Placement) -> Placement:
    if placement.mode is ExecutionMode.AUTO:
        raise FlowDeclarationError("the plan's placement is 'auto': plan it first "
                                   "(rlinf.workers.flow.launch_auto) and launch the result")
    placed, declared = set(placement.component_names), set(flow.names)
    if placed != declared:
        raise FlowDeclarationError(
            f"the plan places {sorted(placed)} but the flow declares {sorted(declared)}: "
            "place every component exactly once")
    for spec in flow.components:
        devices = placement.devices_of(spec.name)
        most = spec.component.max_devices
        if most is not None and len(devices) > most:
            raise FlowDeclarationError(
                f"the plan gives {spec.name!r} devices {list(devices)}, but it runs on at most "
                f"{most} (Component.max_devices): place it on fewer devices")
    inlined = flow.inlined(placement)
    for loop in flow.loops:
        for a, b in itertools.combinations(loop.components, 2):
            shared = set(placement.devices_of(a)) & set(placement.devices_of(b))
            if shared and inlined.get(a) != b and inlined.get(b) != a:
                raise FlowDeclarationError(
                    f"the plan puts {a!r} and {b!r}, which take turns in a loop, both on "
                    f"device(s) {sorted(shared)} in separate processes: each would hold the "
                    f"device for its whole part of the loop while waiting for the other. Place "
                    f"them on the same devices (one runs inside the other where the flow "
                    f"declares inline_with) or on disjoint ones ({placement.to_spec()!r})")
    for sync in flow.weight_syncs:
        apart = [d for d in sync.dst if placement.devices_of(d) != placement.devices_of(sync.src)]
        if sync.transport == "cuda_ipc" and apart:
            raise FlowDeclarationError(
                f"weight sync {sync.src!r} -> {list(sync.dst)} forces 'cuda_ipc', but {apart} "
                f"do not run on {sync.src!r}'s devices in {placement.to_spec()!r}: use 'auto' "
                "or place them together")
    return placement


def _cpus_per_rank(placement: Placement, *, process_sets: Iterable[tuple[str, ...]],
                   cluster: Cluster | None = None) -> float:
    """An equal share of the Ray cluster's CPUs per launched process (at most one). The total,
    not what is free right now: a flow closed just before still returns its CPUs for a
    moment, and Ray starts the new ranks as soon as they are back. A cluster discovered
    from Ray counts its own nodes' CPUs: Ray keeps counting a lost node's for a while (until
    it misses enough heartbeats), and shares sized for CPUs that are gone never start."""
    # Counted per placed process of each set: a one_process component, which runs fewer,
    # gets less.
    ranks = sum(placement.components[members[0]].num_procs for members in process_sets)
    if cluster is not None and cluster.nodes and all(n.ray_node_id for n in cluster.nodes):
        total = float(sum(n.cpus for n in cluster.nodes))
    elif connected():
        total = float(ray.cluster_resources().get("CPU", 0.0))
    else:  # local processes: a share is bookkeeping only, nothing is reserved
        return 1.0
    share = min(1.0, int(100 * total / ranks) / 100)
    if share < 0.01:
        raise ConfigError(f"the Ray cluster has {total:g} CPUs for {ranks} worker ranks; start "
                          "Ray with more CPUs or place fewer ranks")
    return share


def _gpus_per_rank(flow: MacroFlow, members: tuple[str, ...], placement: Placement, *,
                   inlined: Mapping[str, str], process_sets: Iterable[tuple[str, ...]]
                   ) -> float:
    """On CUDA, a process serving a GPU component reserves 1/(process sets on its device ×
    processes per device) of a GPU; processes serving only CPU components, and CPU flows,
    reserve none (a host serving an inlined GPU component computes on the GPU too). A
    declared `ComponentSpec.num_gpus` (the largest of the members' and their guests')
    overrides the share."""
    served = [*members, *(guest for guest, host in inlined.items() if host in members)]
    specs = [flow.component(name) for name in served]
    declared = [s.num_gpus for s in specs if s.num_gpus is not None]
    if declared:
        return max(declared)
    if flow.device != "cuda" or not any(s.component.resource == "gpu" for s in specs):
        return 0.0
    sets = list(process_sets)
    sharing = max(sum(1 for other in sets if d in placement.devices_of(other[0]))
                  for d in placement.devices_of(members[0]))
    return 1.0 / (sharing * placement.procs_per_device(members[0]))


def _await_exit(groups: Iterable[WorkerGroup], *, timeout: float) -> None:
    """Return once Ray knows every rank of `groups` is gone (so their CPUs are free for the
    next launch): a call on a killed actor fails exactly then. Returns early when the
    cluster stops answering (``ray stop`` under a closing run): Ray would never say."""
    refs: list[Any] = [actor.worker_info.remote() for group in groups for actor in group.actors]
    deadline = time.monotonic() + timeout
    with contextlib.suppress(Exception):
        while refs and (left := deadline - time.monotonic()) > 0:
            _, refs = call_refs.wait(refs, num_returns=len(refs),
                                     timeout=min(WAIT_SLICE_S, left))
            if refs and not cluster_reachable(timeout=0.5):
                return


def _stop(lock: Any, store: TCPStore | None, owns_ray: bool) -> None:
    if lock is not None:
        with contextlib.suppress(Exception):
            lock.close()
    if store is not None:
        with contextlib.suppress(Exception):
            store.close()
    if owns_ray:
        stop_ray()


def _driver_path() -> dict[str, str]:
    """The driver's import path ahead of the worker's own (Ray expands ``${PYTHONPATH}``): a
    user's module — a reward function, a component class defined beside the program — imports
    in the workers as in the driver, also on a Ray instance started before the driver was
    (entries missing on another node are skipped there by Python)."""
    entries = [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]
    return {"PYTHONPATH": os.pathsep.join([*dict.fromkeys(entries), "${PYTHONPATH}"])}


def _node_address() -> str:
    """This node's address in the Ray cluster (loopback without Ray)."""
    if connected():
        with contextlib.suppress(Exception):
            return str(ray.util.get_node_ip_address())
    return "127.0.0.1"
