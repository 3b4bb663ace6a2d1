"""`LaunchedFlow`: a task's handle on the `FlowRun` it launched, and `IterationResult`, what
its iterations return.

An app wraps its run to add what only its task knows (an iteration's metrics, evaluation,
checkpoints). What every such handle needs is here: the plan, the worker groups (refused
once the run is closed, with what to do instead), the trainers' checkpoints, spans and
onloads, and a close that also removes what the launch made beside the run (a model folder
exported for the engine), on errors too when used as a context manager.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from rlinf.sched import ExecutionPlan
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow.errors import FlowClosedError
from rlinf.workers.flow.run import FlowRun
from rlinf.workers.runtime import WorkerGroup
from rlinf.workers.telemetry import Span

__all__ = ["IterationResult", "LaunchedFlow"]


@dataclass(frozen=True, kw_only=True)
class IterationResult:
    """What one iteration of a launched flow did, as the runner reads it; a task's
    subclass adds what its iterations count (samples, env steps)."""

    step: int
    """The iteration's index."""
    metrics: Mapping[str, float]
    """The task's metrics of the iteration, per-component seconds included."""
    seconds: float
    """Wall time of the iteration, weight sync included."""
    spans: Sequence[Span] = ()
    """One track per worker rank (empty without trace)."""
    onloads: int = 0
    """Onloads the device lock ran during the iteration, over every worker process (its
    context switches; 0 without a lock)."""


class LaunchedFlow:
    """One launched run of a task's flow (module docstring)."""

    def __init__(self, run: FlowRun, *, trace: bool = False,
                 on_close: Callable[[], None] | None = None) -> None:
        self.run = run
        self.trace = trace
        """Whether the ranks record spans (`drain_spans` then has them)."""
        self._on_close = on_close

    @property
    def plan(self) -> ExecutionPlan:
        """The plan the flow runs."""
        return self.run.plan

    @property
    def groups(self) -> Mapping[str, WorkerGroup]:
        """The worker group of each component."""
        return self.run.groups

    def group(self, name: str) -> WorkerGroup:
        """The worker group of component `name`, refused once the flow is closed."""
        self._check_open()
        return self.run.group_of(name)

    def save(self, directory: Path) -> None:
        """Each trainer's state (every weight-sync sender's ``save``: model, optimizer, RNG
        and step of each rank) under ``directory/<trainer>``. A flow whose other components
        keep state of their own (simulators, sampling streams) saves them too."""
        self._check_open()
        for name in self.run.flow.trainers:
            self.group(name).call("save", str(Path(directory) / name), timeout=self.run.timeout)

    def load(self, directory: Path) -> None:
        """Restore `save`'s state, then sync the restored weights to their receivers."""
        self._check_open()
        for name in self.run.flow.trainers:
            folder = Path(directory) / name
            if not folder.is_dir():
                raise ConfigError(f"no flow checkpoint in {directory} (expected {folder}); "
                                  f"save one with {type(self).__name__}.save")
            self.group(name).call("load", str(folder), timeout=self.run.timeout)
        self.sync_weights()

    def sync_weights(self) -> float:
        """Sync the trainer's weights into their receivers now; seconds taken."""
        return self.run.sync_weights()

    def onloads(self, *, since: float) -> int:
        """Onloads the device lock ran in every rank since Unix time `since`."""
        return self.run.onloads(since=since)

    def drain_spans(self) -> list[Span]:
        """Spans every rank recorded since the last drain (none without `trace`)."""
        return self.run.drain_spans() if self.trace else []

    def _check_open(self) -> None:
        if self.run.closed:
            raise FlowClosedError(f"this {type(self).__name__} is closed (after close() or a "
                                  "dead worker); launch a new one and load the last checkpoint")

    def close(self, *, kill: bool = False) -> None:
        """Stop the run (`kill`: without shutdown hooks, for ranks that may be stuck) and
        remove what the launch made beside it; idempotent."""
        self.run.close(kill=kill)
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            with contextlib.suppress(OSError):
                on_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(kill=exc is not None)
