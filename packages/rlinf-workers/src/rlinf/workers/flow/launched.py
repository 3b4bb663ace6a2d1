"""`LaunchedFlow`: a task's handle on the `FlowRun` it launched.

An app wraps its run to add what only its task knows (an iteration's metrics, evaluation,
checkpoints). What every such handle needs is here: the plan, the worker groups (refused
once the run is closed, with what to do instead), spans and onloads, and a close that also
removes what the launch made beside the run (a model folder exported for the engine), on
errors too when used as a context manager.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Self

from rlinf.sched import ExecutionPlan
from rlinf.workers.flow.errors import FlowClosedError
from rlinf.workers.flow.run import FlowRun
from rlinf.workers.runtime import WorkerGroup
from rlinf.workers.telemetry import Span

__all__ = ["LaunchedFlow"]


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
