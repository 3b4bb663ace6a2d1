"""Pricing a component that works through one iteration's batch in pieces as they arrive.

A trainer that streams (gradients of each micro-batch as soon as its samples arrive, one
optimizer step after the last) does the same work as one call on the whole batch; only
its start moves earlier. A curve fitted to whole-batch calls (the profile's) prices a
small call with the whole call's fixed part (the optimizer step, the call's set-up), so
charging it once per piece overprices the stream by that part times the pieces (a small
piece priced by the fit costs well over its share of the whole call, and a plan that
streams is priced far above what it runs). `StreamedCosts` prices each piece at its share
of the whole-batch call instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlinf.sched.errors import ProfileError

__all__ = ["StreamedCosts"]


@dataclass(frozen=True)
class StreamedCosts:
    """`base` (a `rlinf.sched.CostModel`), with a call of `component` on fewer than `whole`
    items priced pro rata: ``base.time(whole) * batch_size / whole`` on the same devices.
    Memory stays `base`'s at the piece's size (the activations held are the piece's);
    every other component is `base`'s."""

    base: Any
    component: str
    whole: int
    """Items of one iteration the component streams through (all its ranks together)."""

    def __post_init__(self) -> None:
        if self.whole < 1:
            raise ProfileError(f"StreamedCosts for {self.component!r} with whole={self.whole}: "
                               "expected the iteration's batch, >= 1 item")

    def time(self, component: str, *, batch_size: int, num_devices: int) -> float:
        if component != self.component or batch_size >= self.whole:
            return float(self.base.time(component, batch_size=batch_size,
                                        num_devices=num_devices))
        whole = float(self.base.time(component, batch_size=self.whole, num_devices=num_devices))
        return whole * batch_size / self.whole

    def memory(self, component: str, *, batch_size: int, num_devices: int) -> int:
        return int(self.base.memory(component, batch_size=batch_size, num_devices=num_devices))

    def switch_time(self, component: str) -> float:
        return float(self.base.switch_time(component))
