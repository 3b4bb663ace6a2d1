"""What a long planning search reports while it runs.

A search on many devices, or an exact pass on a cluster of shared CPU slots, can simulate for
seconds; `plan(progress=)` is called every `PROGRESS_EVERY_S` seconds of it with what it has
done, so a caller can show a line instead of going silent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PROGRESS_EVERY_S", "PlanProgress", "ProgressCallback", "Ticker"]

PROGRESS_EVERY_S = 3.0
"""Seconds between two reports."""


@dataclass(frozen=True)
class PlanProgress:
    """Where a planning search stands."""

    phase: str
    """``"search"`` (the coarse-to-fine search) or ``"exact"`` (branch and bound)."""
    simulations: int
    """Simulations run so far."""
    seconds: float
    """Seconds since planning started."""
    best: float
    """Fastest simulated iteration so far, in seconds (inf while none fits)."""

    def line(self, unit: str = "iteration") -> str:
        """``(exact): 5000 simulations in 3 s, the best so far 0.123 s per step``."""
        return (f"({self.phase}): {self.simulations} simulations in {self.seconds:.0f} s, "
                f"the best so far {self.best:.3g} s per {unit}")


ProgressCallback = Callable[[PlanProgress], None]


class Ticker:
    """Counts simulations and calls the callback at most every `every` seconds."""

    def __init__(self, callback: ProgressCallback | None, *,
                 every: float = PROGRESS_EVERY_S) -> None:
        self.callback = callback
        self.every = every
        self.phase = "search"
        self.simulations = 0
        self.best = math.inf
        self.started = time.perf_counter()
        self._next = self.started + every

    def simulated(self, iteration_time: float | None) -> None:
        """One more simulation, of `iteration_time` (None: it does not fit)."""
        self.simulations += 1
        if iteration_time is not None and iteration_time < self.best:
            self.best = iteration_time
        if self.callback is None:
            return
        now = time.perf_counter()
        if now >= self._next:
            self._next = now + self.every
            self.callback(PlanProgress(self.phase, self.simulations, now - self.started,
                                       self.best))
