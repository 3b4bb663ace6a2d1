"""`FlowWorker`: the base of every component a flow launches (a `Worker`, so a Ray actor).

What a component needs from the runtime, written once:

- `turn`: hold this rank's devices through the run's device lock (when its devices are
  shared) for one unit of work, so components placed on the same devices take turns; a
  component that implements ``onload``/``offload`` (`rlinf.sched.Onloadable`) is registered
  with the lock and context-switched. Time inside turns is the component's busy time.
- `channel` / `create_channel`: open the `FlowChannel`s an entry method is handed (rank 0 of
  a consumer owns its input channel; the driver never touches one).
- `run_entry`: how the runtime calls the component's declared entry method each iteration —
  it hands over the component's channels (``input_channel=``/``output_channel=``, or
  ``inputs=``/``outputs=`` mappings where the entry takes them), measures busy and wall
  time (per component, when the rank also serves an inlined one), peak memory and
  device-lock use, and returns them with the entry's metrics as an `EntryReport` (the
  runtime's profile of the iteration).
- torch's and BLAS's CPU threads per rank (``num_threads``), kept at every turn;
- a `TraceRecorder` on track ``"{role}/{rank}"``, recording when the launch asked for a trace
  (`WorkerContext.trace`) or the constructor's ``trace`` says so.

Rule that keeps shared devices deadlock-free: a component never waits on a channel while
holding its devices; it takes an input first, then the devices.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rlinf.comm import Channel, CommError, Endpoint, RayStore, Store, TCPStore
from rlinf.sched import Profiler
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow.channels import FlowChannel, Sharding, parse_store
from rlinf.workers.flow.context import StepContext
from rlinf.workers.flow.peer import PeerChannel, endpoint_name
from rlinf.workers.runtime import Worker, WorkerContext
from rlinf.workers.runtime.threads import set_cpu_threads
from rlinf.workers.telemetry import Span, TraceRecorder

__all__ = ["EntryReport", "FlowWorker", "entry_parameters"]


def entry_parameters(worker: type, entry: str) -> frozenset[str]:
    """Names of the keyword parameters of ``worker.entry`` (how the runtime passes its
    channels: ``input_channel``/``output_channel`` or ``inputs``/``outputs``)."""
    method = getattr(worker, entry, None)
    if method is None:
        return frozenset()
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):  # a builtin or C method: say nothing about it
        return frozenset()
    return frozenset(parameters)


@dataclass(frozen=True)
class EntryReport:
    """What one rank's entry call did in one iteration."""

    rank: int
    """The reporting rank."""
    metrics: Mapping[str, float]
    """What the entry method returned."""
    busy_seconds: float
    """Seconds inside device turns (`FlowWorker.turn`): the component's compute time."""
    wall_seconds: float
    """Seconds the call took, waits on channels and devices included."""
    started: float
    """Unix time the call started."""
    peak_memory_bytes: int = 0
    """Peak memory during the call (CUDA allocator peak, or the process's peak RSS)."""
    memory_source: str = "none"
    """``"cuda"``, ``"rss"`` or ``"none"`` (`rlinf.sched.Measurement`)."""
    lock_holds: int = 0
    """Device-lock grants the call took (0 without a lock)."""
    switches: tuple[tuple[str, float], ...] = field(default=())
    """``(direction, seconds)`` of every onload/offload of this rank during the call."""
    busy_by_component: Mapping[str, float] = field(default_factory=dict)
    """The busy seconds of each component this rank served (its own and inlined ones)."""
    calls: tuple[tuple[str, int, int, float], ...] = ()
    """``(component, items, devices, seconds)`` of each call the entry timed
    (`FlowWorker.timed_call`)."""
    sent: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    """``{edge: (weight, bytes)}``: what the call put into each output channel (items by
    their weight, array bytes), from which the profile measures each edge's bytes per
    item."""


class FlowWorker(Worker):
    """Base of flow components (see the module docstring)."""

    input_sharding: ClassVar[Sharding] = "round_robin"
    """How this component's ranks split the units of its input channel (`Sharding`)."""

    def __init__(self, context: WorkerContext, *, trace: bool = False,
                 lock_timeout: float = 600.0, io_timeout: float = 600.0,
                 num_threads: int | None = None) -> None:
        """`num_threads`: torch's and BLAS's CPU threads for this rank's compute (one per CPU
        slot is the rule: more oversubscribe the cores), set now and again at every `turn`
        (OpenMP's count is per calling thread, and Ray may call on another thread than the
        constructor's); None leaves the process's default."""
        super().__init__(context)
        if lock_timeout <= 0 or io_timeout <= 0:
            raise ConfigError(f"lock_timeout and io_timeout must be > 0, got {lock_timeout} "
                              f"and {io_timeout}")
        if num_threads is not None and num_threads < 1:
            raise ConfigError(f"num_threads must be >= 1 or None, got {num_threads}")
        self.num_threads = num_threads
        if num_threads is not None:
            set_cpu_threads(num_threads)
        self.trace = TraceRecorder(f"{context.role}/{context.rank}",
                                   enabled=trace or context.trace)
        self.lock_timeout = lock_timeout
        self.io_timeout = io_timeout
        self._handles: dict[str, Channel | PeerChannel] = {}
        self._mailboxes: dict[str, Any] = {}
        self._owned: dict[str, Channel] = {}
        self._stores: dict[str, Store] = {}
        self._busy = 0.0
        self._busy_by: defaultdict[str, float] = defaultdict(float)
        self._holds = 0
        self._switch_seen = 0.0
        self._calls: list[tuple[str, int, int, float]] = []

    # -- device turns ----------------------------------------------------------------------

    @contextlib.contextmanager
    def turn(self, name: str, *, component: str | None = None, **args: Any) -> Iterator[None]:
        """Hold this rank's devices (if the run has a device lock) for one span of work, done
        for `component` (default: this worker's own; an inlined component's name when this
        rank serves it, so each is profiled apart)."""
        if self.num_threads is not None:
            set_cpu_threads(self.num_threads, rescan=False)
        locked = self.context.device_lock_address is not None
        hold = (self.hold_devices(timeout=self.lock_timeout) if locked
                else contextlib.nullcontext())
        with hold, self.trace.span(name, **args):
            if locked:
                self._holds += 1
            start = time.perf_counter()
            try:
                yield
            finally:
                seconds = time.perf_counter() - start
                self._busy += seconds
                self._busy_by[component or self.role] += seconds

    @contextlib.contextmanager
    def timed_call(self, items: int, *, component: str | None = None) -> Iterator[None]:
        """Time the block as one call of `items` items on this rank's devices, for the
        profile (`EntryReport.calls`): a rollout micro-batch, a message scored, a training
        micro-batch. A run that prices itself from its own steps fits these points, at the
        sizes the component really computes, beside its whole phase."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._calls.append((component or self.role, int(items), max(1, len(self.devices)),
                                time.perf_counter() - start))

    def charge(self, component: str, seconds: float) -> None:
        """Count `seconds` of this rank's own busy time as `component`'s (an inlined
        component whose work ran inside one of this rank's turns)."""
        moved = min(max(seconds, 0.0), self._busy_by[self.role])
        self._busy_by[self.role] -= moved
        self._busy_by[component] += moved

    def busy_seconds(self) -> float:
        """Seconds spent inside `turn` since the last call (then reset)."""
        busy, self._busy = self._busy, 0.0
        return busy

    def drain_spans(self) -> list[Span]:
        """Spans recorded since the last call, device-lock switches included."""
        spans = self.trace.drain()
        for event in (self._device_lock.switch_events if self._device_lock is not None else ()):
            if event.started >= self._switch_seen:
                spans.append(Span(self.trace.track, event.direction, event.started,
                                  event.started + event.seconds, {"device": event.device}))
        self._switch_seen = time.time()
        return spans if self.trace.enabled else []

    # -- channels --------------------------------------------------------------------------

    def _store(self, name: str) -> Store:
        store = self._stores.get(name)
        if store is None:
            _, address = parse_store(name)
            store = self._stores[name] = (TCPStore(address) if address is not None
                                          else RayStore(name))
            try:  # roles used in one process (tests, drivers) share its existing endpoint
                Endpoint.current()
            except CommError:
                # A launched rank's own endpoint (token from the env), named so that p2p
                # peers address it without a lookup.
                Endpoint(endpoint_name(name, self.role, self.rank), store=store).make_current()
        return store

    def join_store(self, store: str) -> str:
        """Open this rank's endpoint in the run's store (at launch, before any send)."""
        self._store(store)
        return endpoint_name(store, self.role, self.rank)

    def create_channel(self, channel: FlowChannel) -> str:
        """Create and serve `channel` from this process (rank 0 of its consumer, at launch)."""
        if channel.name in self._owned:
            return channel.name
        handle = Channel.create(channel.name, store=self._store(channel.store))
        self._owned[channel.name] = handle
        self._handles[channel.name] = handle
        return channel.name

    def link(self, channel: FlowChannel, *, peer: int | None = None) -> Channel | PeerChannel:
        """This process's handle on either kind of edge, for code that only puts and gets
        by key: the `rlinf.comm.Channel` (`channel`) or, for a p2p edge, a `PeerChannel` to
        the other end's rank `peer` (made on first use, then reused; None: the one rank this
        rank pairs with, `FlowChannel.peers`)."""
        if channel.transport != "p2p":
            return self.channel(channel)
        peers = channel.peers(self.role, self.rank)
        if peer is None:
            if len(peers) != 1:
                raise ConfigError(f"{self.role!r} rank {self.rank} pairs with ranks "
                                  f"{list(peers)} over p2p edge {channel.edge}: name the peer "
                                  "(link(channel, peer=) or links(channel))")
            peer = peers[0]
        elif peer not in peers:
            raise ConfigError(f"{self.role!r} rank {self.rank} pairs with ranks {list(peers)} "
                              f"over p2p edge {channel.edge}, not {peer}")
        key = f"{channel.name}#{peer}"
        handle = self._handles.get(key)
        if handle is None:
            other = channel.dst if self.role == channel.src else channel.src
            address = endpoint_name(channel.store, other, peer)
            endpoint = Endpoint.current(store=self._store(channel.store))
            if endpoint.name != endpoint_name(channel.store, self.role, self.rank):
                raise ConfigError(f"p2p edge {channel.edge} needs this rank's own endpoint "
                                  f"{endpoint_name(channel.store, self.role, self.rank)!r}, "
                                  f"but the process already uses {endpoint.name!r}: run the "
                                  "component in a process of its own (FlowRun) or use "
                                  "transport='channel'")
            handle = self._handles[key] = PeerChannel(
                endpoint, edge=channel.name,
                peer=address, timeout=self.io_timeout,
                filed=self._mailboxes.setdefault(address, PeerChannel.mailbox()))
        return handle

    def links(self, channel: FlowChannel) -> dict[int, Channel | PeerChannel]:
        """`link` to every rank of the other end this rank pairs with (`FlowChannel.peers`),
        by rank; on a channel edge every one is the same shared `rlinf.comm.Channel`."""
        return {peer: self.link(channel, peer=peer if channel.transport == "p2p" else None)
                for peer in channel.peers(self.role, self.rank)}

    def channel(self, channel: FlowChannel) -> Channel:
        """This process's `rlinf.comm.Channel` of `channel` (connected on first use, then
        reused); p2p edges have none (`link`)."""
        if channel.transport == "p2p":
            raise ConfigError(f"edge {channel.edge} is p2p: open it with link(), which "
                              "returns its PeerChannel")
        handle = self._handles.get(channel.name)
        if isinstance(handle, Channel):
            return handle
        connected = Channel.connect(channel.name, store=self._store(channel.store),
                                    timeout=self.io_timeout)
        self._handles[channel.name] = connected
        return connected

    # -- the runtime's call ----------------------------------------------------------------

    def run_entry(self, entry: str, ctx: StepContext, *,
                  inputs: Mapping[str, FlowChannel] | None = None,
                  outputs: Mapping[str, FlowChannel] | None = None) -> EntryReport:
        """Call the entry method with this component's channels — ``entry(ctx, inputs=,
        outputs=)`` where it takes those mappings (keyed by the peer component), else
        ``entry(ctx, input_channel=, output_channel=)`` with the one channel of each side —
        and report its metrics, busy and wall time, peak memory and device-lock use."""
        method = getattr(self, entry, None)
        if entry.startswith("_") or not callable(method):
            raise ConfigError(f"{type(self).__name__} has no public entry method {entry!r}")
        takes = entry_parameters(type(self), entry)
        channels: dict[str, Any] = {}
        for plural, single, given in (("inputs", "input_channel", dict(inputs or {})),
                                      ("outputs", "output_channel", dict(outputs or {}))):
            if plural in takes:
                channels[plural] = given
            elif len(given) > 1:
                raise ConfigError(f"{type(self).__name__}.{entry} takes one {single}, but the "
                                  f"flow gives it {sorted(given)}: take {plural}= instead")
            elif given:
                channels[single] = next(iter(given.values()))
        outs = list(dict(outputs or {}).values())
        sent_before = {c.edge: self._sent_on(c) for c in outs}
        probe = Profiler(metadata={"role": self.role, "rank": self.rank})
        busy, holds = self._busy, self._holds
        self._busy_by.clear()
        self._calls.clear()
        started, t0 = time.time(), time.perf_counter()
        with probe.measure(self.role, batch_size=max(1, ctx.items.get(self.role, 1)),
                           num_devices=max(1, len(self.devices))):
            metrics = method(ctx, **channels)
        wall = time.perf_counter() - t0
        sent: dict[str, tuple[float, int]] = {}
        for c in outs:
            (weight, nbytes), (weight_before, bytes_before) = self._sent_on(c), sent_before[c.edge]
            sent[c.edge] = (weight - weight_before, nbytes - bytes_before)
        peak = probe.profile.measurements[-1]
        events = self._device_lock.switch_events if self._device_lock is not None else ()
        return EntryReport(
            rank=self.rank, metrics={k: float(v) for k, v in dict(metrics or {}).items()},
            busy_seconds=self._busy - busy, busy_by_component=dict(self._busy_by),
            calls=tuple(self._calls),
            wall_seconds=wall, started=started,
            peak_memory_bytes=peak.peak_memory_bytes, memory_source=peak.memory_source,
            lock_holds=self._holds - holds, sent=sent,
            switches=tuple((e.direction, e.seconds) for e in events if e.started >= started))

    def _sent_on(self, channel: FlowChannel) -> tuple[float, int]:
        """``(weight, bytes)`` this rank has put into `channel` so far (over every peer of
        a p2p edge)."""
        handles = [h for key, h in self._handles.items()
                   if key == channel.name or key.startswith(f"{channel.name}#")]
        return (sum(h.sent[0] for h in handles), sum(h.sent[1] for h in handles))

    def shutdown(self) -> None:
        """Drop channel handles (clients first, then the channels this rank owns)."""
        for name, handle in list(self._handles.items()):
            if name not in self._owned:
                with contextlib.suppress(Exception):
                    handle.disconnect()
        for handle in self._owned.values():
            with contextlib.suppress(Exception):
                handle.disconnect()
        self._handles.clear()
        self._owned.clear()
        super().shutdown()
