"""`StepContext`: what every component's entry method is told about the iteration it runs.

The driver passes control, never data: the context says which iteration this is, how many
items each component processes, how many ranks each has and where the plan put them. The
data itself arrives through the component's input channel (`FlowChannel`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rlinf.sched import Placement
from rlinf.workers.errors import ConfigError

__all__ = ["StepContext"]


@dataclass(frozen=True)
class StepContext:
    """One iteration as the driver launched it (picklable; the same for every rank)."""

    step: int
    """The iteration's index (seeds random draws: ``draw_seed(seed, step, ...)``)."""
    items: Mapping[str, int]
    """Items each component processes this iteration (its declared batch, or the size the
    runtime profiles it at)."""
    ranks: Mapping[str, int]
    """Ranks of each component's worker group."""
    placement: Placement
    """Where the plan put every component."""
    micro_batch: Mapping[str, int] = field(default_factory=dict)
    """The plan's items per call of each component."""
    sources: tuple[str, ...] = ()
    """Components without an input channel (they produce the iteration's data)."""
    loop_steps: Mapping[str, int] = field(default_factory=dict)
    """Steps this iteration of the loop each looping component belongs to."""
    inlined: Mapping[str, str] = field(default_factory=dict)
    """``{component: host}`` for components served inside their host's process."""

    def __post_init__(self) -> None:
        if self.step < 0:
            raise ConfigError(f"step must be >= 0, got {self.step}")
        bad = {name: n for name, n in self.items.items() if n < 1}
        if bad:
            raise ConfigError(f"every component needs >= 1 item per iteration, got {bad}")
        bad = {name: n for name, n in self.loop_steps.items() if n < 1}
        if bad:
            raise ConfigError(f"every loop needs >= 1 step per iteration, got {bad}")

    def shares_devices(self, a: str, b: str) -> bool:
        """Whether components `a` and `b` have a device in common (they take turns on it)."""
        return bool(set(self.placement.devices_of(a)) & set(self.placement.devices_of(b)))
