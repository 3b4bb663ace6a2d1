"""The cost-model interface shared by the profiler (measured costs) and the planner.

Anything that prices a component's work implements `CostModel`: the profiler's fitted curves
(`rlinf.sched.profiler.FittedCostModel`), analytic models the planner ships, or a test's table.
The planner and the discrete-event simulator depend only on this Protocol.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["CostModel"]


@runtime_checkable
class CostModel(Protocol):
    """Predicts time, memory and context-switch cost of one step of a component.

    Units: seconds and bytes. `batch_size` is the number of samples (sequences, env steps) one
    call of the component processes in total; `num_devices` is how many devices that call is
    spread over (data parallel). Implementations raise `rlinf.sched.errors.ProfileError` for a
    component they know nothing about.
    """

    def time(self, component: str, *, batch_size: int, num_devices: int) -> float:
        """Wall-clock seconds for one call on `batch_size` samples over `num_devices` devices."""
        ...

    def memory(self, component: str, *, batch_size: int, num_devices: int) -> int:
        """Peak bytes needed on each device for that call (weights, activations, caches)."""
        ...

    def switch_time(self, component: str) -> float:
        """Seconds to offload then onload the component when it yields a shared device."""
        ...
