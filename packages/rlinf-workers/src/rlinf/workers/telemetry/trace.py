"""Timeline spans: record them in workers, write them as a Chrome trace, compare to the plan.

A `TraceRecorder` lives inside a worker and keeps `Span`s (wall-clock seconds from
`time.time()`, so spans from different processes on one clock line up); the driver drains
them, and `write_chrome_trace` writes the JSON that chrome://tracing and Perfetto open:
measured spans and the planner's predicted spans (`predicted_spans`) as two processes,
one labelled thread (track) per worker or component.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlinf.workers.errors import ConfigError

if TYPE_CHECKING:
    from rlinf.sched import SimulationResult

__all__ = ["TIMELINE_FILE", "TRACE_FILE", "Span", "TraceRecorder", "predicted_spans",
           "write_chrome_trace", "write_run_trace"]

TRACE_FILE = "trace.json"
"""A run's Chrome trace in its run folder (`write_run_trace`)."""
TIMELINE_FILE = "timeline.png"
"""A run's last measured iteration above the predicted one (`write_run_trace`)."""

MEASURED_PID = 1
"""Chrome-trace process id of measured spans."""
PREDICTED_PID = 2
"""Chrome-trace process id of predicted spans."""


@dataclass(frozen=True)
class Span:
    """One busy interval on one track."""

    track: str
    """Row it belongs to: a worker (``"rollout/0"``) or a component."""
    name: str
    """What ran (``"generate"``, ``"train"``, ``"switch"``)."""
    start: float
    """Start, seconds (``time.time()`` for measured spans)."""
    end: float
    """End, seconds; ``end >= start``."""
    args: Mapping[str, Any] = field(default_factory=dict)
    """Extra data shown when the span is selected (batch size, step, ...)."""

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ConfigError(f"span {self.name!r} on {self.track!r} ends ({self.end}) before "
                              f"it starts ({self.start})")

    @property
    def duration(self) -> float:
        """``end - start`` in seconds."""
        return self.end - self.start


class TraceRecorder:
    """Collects spans on one track inside a process; cheap enough to leave on.

    Args:
        track: the row these spans belong to (e.g. ``f"{role}/{rank}"``).
        enabled: when False, `span` and `add` record nothing.
    """

    def __init__(self, track: str, *, enabled: bool = True) -> None:
        self.track = track
        self.enabled = enabled
        self._spans: list[Span] = []
        self._lock = threading.Lock()

    @contextmanager
    def span(self, name: str, **args: Any) -> Iterator[None]:
        """Time the body of a ``with`` block as one span (recorded even if it raises)."""
        if not self.enabled:
            yield
            return
        start = time.time()
        try:
            yield
        finally:
            self.add(name, start, time.time(), **args)

    def add(self, name: str, start: float, end: float, **args: Any) -> None:
        """Record a span measured elsewhere (seconds, ``time.time()`` clock)."""
        if self.enabled:
            span = Span(self.track, name, start, end, args)
            with self._lock:
                self._spans.append(span)

    def drain(self) -> list[Span]:
        """Return the spans recorded so far and forget them (ship them to the driver)."""
        with self._lock:
            spans, self._spans = self._spans, []
        return spans


def predicted_spans(result: SimulationResult, *, origin: float = 0.0) -> list[Span]:
    """The planner's simulated iteration as spans: one track per component.

    `result` must come from ``simulate(..., record=True)``. Interval times (seconds from the
    start of the simulated iteration) are shifted by `origin`, e.g. the measured start of
    the iteration, so both timelines share one axis. Switch (offload + onload) intervals are
    named ``"switch"``, compute intervals after their component.
    """
    if not result.intervals and result.iteration_time > 0:
        raise ConfigError("the SimulationResult has no intervals; simulate with record=True "
                          "to get the predicted timeline")
    spans = []
    for iv in sorted(result.intervals, key=lambda i: (i.start, i.component)):
        name = iv.component if iv.kind == "compute" else iv.kind
        spans.append(Span(iv.component, name, origin + iv.start, origin + iv.end,
                          {"devices": list(iv.devices), "step": iv.step, "chunk": iv.chunk,
                           "kind": iv.kind}))
    return spans


def _track_ids(spans: Sequence[Span]) -> dict[str, int]:
    return {track: i + 1 for i, track in enumerate(sorted({s.track for s in spans}))}


def _metadata(pid: int, label: str, tracks: Mapping[str, int]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
         "args": {"sort_index": pid}},
    ]
    for track, tid in tracks.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": track}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid}})
    return events


def write_chrome_trace(
    path: Path, spans: Sequence[Span], *, predicted: Sequence[Span] = ()
) -> Path:
    """Write measured (and predicted) spans as a Chrome trace JSON file; returns `path`.

    Times become microseconds from the earliest span of either kind. Measured spans form
    process ``"measured"``, predicted ones process ``"predicted"``; each track is a named
    thread. Open the file in chrome://tracing or https://ui.perfetto.dev.
    """
    path = Path(path)
    everything = [*spans, *predicted]
    origin = min((s.start for s in everything), default=0.0)
    events: list[dict[str, Any]] = []
    for pid, label, group in ((MEASURED_PID, "measured", spans),
                              (PREDICTED_PID, "predicted", predicted)):
        if not group:
            continue
        tracks = _track_ids(group)
        events.extend(_metadata(pid, label, tracks))
        for s in sorted(group, key=lambda s: s.start):
            events.append({
                "name": s.name, "cat": label, "ph": "X", "pid": pid, "tid": tracks[s.track],
                "ts": round((s.start - origin) * 1e6, 3), "dur": round(s.duration * 1e6, 3),
                "args": dict(s.args),
            })
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"origin_unix_s": origin}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, default=str), encoding="utf-8")
    return path


def write_run_trace(run_dir: Path, spans: Sequence[Span], last_step: Sequence[Span],
                    simulation: SimulationResult | None) -> tuple[Path, Path]:
    """A run's `TRACE_FILE` (every measured span, and the planner's simulated iteration
    aligned with the last measured one) and `TIMELINE_FILE` (that last iteration above
    the prediction) in `run_dir`."""
    from rlinf.workers.telemetry.plots import plot_timeline

    origin = min((s.start for s in last_step), default=0.0)
    predicted = predicted_spans(simulation, origin=origin) if simulation is not None else []
    trace = write_chrome_trace(run_dir / TRACE_FILE, spans, predicted=predicted)
    return trace, plot_timeline(run_dir / TIMELINE_FILE, last_step, predicted)
