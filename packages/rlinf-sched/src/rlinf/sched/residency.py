"""The switch rule: which components stay on a shared device, and who must leave.

One rule, used by both sides of the system so that what the planner prices is what runs:
the simulator (`rlinf.sched.simulator`) keeps one `Residency` per group of shared devices and
charges a context switch exactly when `admit` says the incoming component must onload; the
device-lock server (`rlinf.sched._lock_server`) keeps one per device and sends offloads for
exactly the residents `admit` evicts.

The rule:

- A component already resident on the device takes it without a switch.
- Otherwise it onloads (a switch), and residents leave, least recently used first, until the
  incoming component fits beside the rest: ``sum(resident memory) + its memory <= capacity``.
  Components that fit together therefore stay co-resident and never switch again.
- When the capacity or any memory involved is unknown (None), nothing is assumed to fit: the
  incoming component evicts every other resident (one component at a time).
- A component whose memory is 0 (a CPU component on an accelerator's slot) costs nothing to
  keep, so it never evicts anyone and, once loaded, is never evicted for lack of room.

The state machine is pure (no I/O, no clocks): `plan` previews an admission, `commit`
applies it, `admit` does both.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Admission", "Residency"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Admission(Generic[K]):
    """What granting a device to `key` costs under the switch rule."""

    key: K
    onload: bool
    """The incoming component is not resident: it must onload (one switch)."""
    evict: tuple[K, ...]
    """Residents that must offload first, least recently used first."""


class Residency(Generic[K]):
    """The components resident on one device (or one group of identical devices).

    Args:
        capacity: bytes of device memory; None when unknown (one component at a time).
        resident: the initial residents with their memory, least recently used first.
    """

    def __init__(self, capacity: int | None,
                 resident: Iterable[tuple[K, int | None]] = ()) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity={capacity}: expected bytes >= 0 or None")
        self.capacity = capacity
        self._memory: dict[K, int | None] = dict(resident)  # insertion order = LRU order

    @property
    def resident(self) -> tuple[K, ...]:
        """Resident components, least recently used first."""
        return tuple(self._memory)

    def __contains__(self, key: object) -> bool:
        return key in self._memory

    def plan(self, key: K, memory: int | None) -> Admission[K]:
        """What admitting `key` (needing `memory` bytes) would cost; changes nothing."""
        if key in self._memory:
            return Admission(key, onload=False, evict=())
        if memory == 0:
            return Admission(key, onload=True, evict=())
        if self.capacity is None or memory is None:
            evict = tuple(k for k, m in self._memory.items() if m != 0)
            return Admission(key, onload=True, evict=evict)
        used = sum(m for m in self._memory.values() if m is not None)
        unknown = [k for k, m in self._memory.items() if m is None]
        evict_list = list(unknown)  # a resident of unknown size never counts as fitting
        for k, m in self._memory.items():
            if used + memory <= self.capacity:
                break
            if m:  # None was counted above; 0 never needs to leave
                evict_list.append(k)
                used -= m
        return Admission(key, onload=True, evict=tuple(evict_list))

    def commit(self, admission: Admission[K], memory: int | None) -> None:
        """Apply `admission`: drop its evictions, make its key the most recently used."""
        for k in admission.evict:
            self._memory.pop(k, None)
        previous = self._memory.pop(admission.key, memory)
        self._memory[admission.key] = memory if admission.onload else previous

    def admit(self, key: K, memory: int | None) -> Admission[K]:
        """`plan` then `commit`: the device goes to `key`."""
        admission = self.plan(key, memory)
        self.commit(admission, memory)
        return admission

    def discard(self, key: K) -> bool:
        """Forget `key` (it offloaded or its process died); True when it was resident."""
        if key not in self._memory:
            return False
        del self._memory[key]
        return True

    def fits_together(self, memory: Mapping[K, int | None]) -> bool:
        """Whether every component in `memory` can be resident at once on this device."""
        if all(m == 0 for m in memory.values()):
            return True
        if self.capacity is None or any(m is None for m in memory.values()):
            return sum(1 for m in memory.values() if m != 0) <= 1
        return sum(m for m in memory.values() if m is not None) <= self.capacity
