"""What an iteration did, phase by phase, and the profile the planner fits from it.

An iteration is a set of named, timed phases: one per component (its entry call, running
side by side with the others and streaming through channels) and one per weight-sync edge.
Each phase records when it started and ended on the driver's clock, the busiest rank's time
inside device turns (its compute time), the items it processed on how many devices, its
peak memory and its use of the device lock. `profile_of` turns records into an
`rlinf.sched.Profile` — one `Measurement` per component and iteration, one per call its
ranks timed (`PhaseRecord.calls`), plus every onload/offload — which
`rlinf.sched.fit_profile` fits and the planner prices — and, in its metadata, the bytes
per item each channel carried (`edge_bytes_per_item`), which pricing puts in place of the
declaration's estimates.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlinf.sched import Measurement, Profile, Profiler, Workflow
from rlinf.workers.errors import ConfigError

__all__ = ["EDGE_BYTES", "IterationRecord", "PhaseRecord", "edge_bytes_per_item", "profile_of"]

EDGE_BYTES = "edge_bytes_per_item"
"""Profile metadata: ``{edge: bytes per item}`` measured on the channels (`profile_of`)."""


@dataclass(frozen=True)
class PhaseRecord:
    """One named phase of an iteration."""

    name: str
    """The component, or ``"weight_sync:<trainer>"``."""
    started: float
    """Seconds after the iteration started."""
    ended: float
    """Seconds after the iteration started."""
    busy_seconds: float
    """Compute time: the busiest rank's seconds inside device turns (the phase's duration
    for weight sync)."""
    items: int = 0
    """Items processed (0 for weight sync)."""
    num_devices: int = 0
    """Devices the component runs on."""
    peak_memory_bytes: int = 0
    """Largest peak memory of a rank."""
    memory_source: str = "none"
    """``"cuda"``, ``"rss"`` or ``"none"``."""
    lock_holds: int = 0
    """Device-lock grants over all ranks."""
    switches: tuple[tuple[str, float], ...] = ()
    """``(direction, seconds)`` of every onload/offload over all ranks."""
    calls: tuple[tuple[int, int, float], ...] = ()
    """``(items, devices, seconds)`` of each call a rank timed on its own devices
    (`FlowWorker.timed_call`: a rollout micro-batch, a message scored), over all ranks: the
    profile's points at the sizes the component really computes."""
    sent: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    """``{edge: (weight, bytes)}`` put into each output channel over all ranks."""

    @property
    def seconds(self) -> float:
        """Wall time of the phase."""
        return self.ended - self.started

    @property
    def is_component(self) -> bool:
        """Whether the phase is a component's entry call (not weight sync)."""
        return not self.name.startswith("weight_sync:")


@dataclass(frozen=True)
class IterationRecord:
    """One iteration of a flow."""

    step: int
    """The iteration's index."""
    seconds: float
    """Wall time, weight sync included."""
    phases: tuple[PhaseRecord, ...]
    """Component phases in declaration order, then weight-sync phases."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """``"<component>/<key>"``: the mean over ranks of what each entry returned;
    ``"time/<phase>"``: each phase's compute (components) or wall (weight sync) seconds;
    ``"time/dataflow"``: until the last component finished; ``"time/iteration"``."""
    rank_metrics: Mapping[str, tuple[Mapping[str, float], ...]] = field(default_factory=dict)
    """What each component's entry returned on each rank, in rank order (for pooling sums
    exactly where a mean over ranks is not the statistic, e.g. accuracy over unequal
    shards)."""
    trained_step: int | None = None
    """The iteration whose data the trainers (weight-sync senders) trained on: `step`, the
    one before with a policy lag, None where no trainer ran (or the flow has none)."""

    def phase(self, name: str) -> PhaseRecord:
        """The phase called `name`."""
        for phase in self.phases:
            if phase.name == name:
                return phase
        raise ConfigError(f"iteration {self.step} has no phase {name!r}; it has "
                          f"{[p.name for p in self.phases]}")

    @property
    def lock_holds(self) -> int:
        """Device-lock grants over all components."""
        return sum(p.lock_holds for p in self.phases)

    @property
    def switches(self) -> int:
        """Onloads and offloads over all components."""
        return sum(len(p.switches) for p in self.phases)


def iteration_metrics(phases: Sequence[PhaseRecord],
                      rank_metrics: Mapping[str, Sequence[Mapping[str, float]]],
                      *, seconds: float) -> dict[str, float]:
    """The `IterationRecord.metrics` of an iteration (see there)."""
    out: dict[str, float] = {}
    for component, ranks in rank_metrics.items():
        for key in dict.fromkeys(k for rank in ranks for k in rank):
            values = [rank[key] for rank in ranks if key in rank]
            out[f"{component}/{key}"] = statistics.fmean(values)
    for phase in phases:
        out[f"time/{phase.name}"] = phase.busy_seconds
    ends = [p.ended for p in phases if p.is_component]
    out["time/dataflow"] = max(ends) if ends else 0.0
    out["time/iteration"] = seconds
    return out


def profile_of(records: Sequence[IterationRecord], *,
               metadata: Mapping[str, Any] | None = None,
               loop_steps: Mapping[str, int] | None = None) -> Profile:
    """Component measurements and switches of `records`, for `rlinf.sched.fit_profile`.
    A component of a loop (`loop_steps`: its loop's steps per iteration) is measured per
    loop step, as the simulator prices it: its iteration's busy seconds over the steps."""
    steps = dict(loop_steps or {})
    profiler = Profiler(track_memory=False, metadata=dict(metadata or {}))
    for record in records:
        for phase in record.phases:
            if not phase.is_component:
                continue
            profiler.record(Measurement(
                component=phase.name, batch_size=max(phase.items, 1),
                num_devices=max(phase.num_devices, 1),
                seconds=phase.busy_seconds / max(steps.get(phase.name, 1), 1),
                peak_memory_bytes=phase.peak_memory_bytes, memory_source=phase.memory_source,
                timestamp=0.0))
            for items, devices, seconds in phase.calls:
                profiler.record(Measurement(
                    component=phase.name, batch_size=max(items, 1),
                    num_devices=max(devices, 1), seconds=seconds, peak_memory_bytes=0,
                    memory_source="none", timestamp=0.0))
            for direction, seconds in phase.switches:
                profiler.record_switch(phase.name, direction, seconds)
    return profiler.profile


def edge_bytes_per_item(records: Sequence[IterationRecord], workflow: Workflow
                        ) -> dict[str, float]:
    """``{edge: bytes per item}`` of the array bytes `records`' components put into their
    channels, per item as the simulator counts an edge's items (`Workflow.edge_items`: the
    consumer's items of that iteration unless the edge fixes them; per step inside a loop).
    Edges that carried nothing measurable are left out."""
    edges = {e.key: e for e in workflow.edges}
    totals: dict[str, list[float]] = {}
    for record in records:
        items = {p.name: p.items for p in record.phases if p.is_component}
        for phase in record.phases:
            for key, (_weight, nbytes) in phase.sent.items():
                edge = edges.get(key)
                if edge is None:
                    continue
                loop = workflow.loop_of(edge.src)
                steps = (workflow.loops[loop].steps
                         if loop is not None and loop == workflow.loop_of(edge.dst) else 1)
                count = edge.items if edge.items is not None else items.get(edge.dst, 0)
                total = totals.setdefault(key, [0.0, 0.0])
                total[0] += count * steps
                total[1] += nbytes
    return {key: nbytes / count for key, (count, nbytes) in totals.items() if count > 0}
