"""Which components share a worker process: `process_sets`, the one rule the runtime
launches by and the simulator prices.

Components that a placement puts on exactly the same devices with as many processes per
device take turns on those devices anyway; running them in processes of their own costs a
process start each (an interpreter, torch and the model imported again) and makes every
turn and message between them cross processes. So they share one process per rank, and
hand over turns and messages in-process. A component marked `Component.isolated` (a
simulator that may crash, an engine that wants its own process) always runs alone.
"""

from __future__ import annotations

from collections.abc import Collection

from rlinf.sched.placement import Placement

__all__ = ["process_of", "process_sets"]


def process_sets(placement: Placement, *, isolated: Collection[str] = ()
                 ) -> tuple[tuple[str, ...], ...]:
    """The components each set of worker processes serves, in placement order: components
    on the same devices with the same processes per device together, each `isolated` one
    (and any component no other matches) alone."""
    sets: dict[tuple[object, ...], list[str]] = {}
    for comp in placement:
        key: tuple[object, ...] = (("alone", comp.component) if comp.component in isolated
                                   else (comp.devices, comp.procs_per_device))
        sets.setdefault(key, []).append(comp.component)
    return tuple(tuple(members) for members in sets.values())

def process_of(placement: Placement, *, isolated: Collection[str] = ()) -> dict[str, int]:
    """Each component's index in `process_sets` (equal indices: one process per rank)."""
    return {name: index
            for index, members in enumerate(process_sets(placement, isolated=isolated))
            for name in members}
