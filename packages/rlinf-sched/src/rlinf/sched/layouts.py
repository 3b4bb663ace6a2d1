"""Placements a mode names, laid out without profiling, and the one overlap rule every fixed
placement keeps.

``parse_placement`` reads specs and ``collocated``; the planner decides ``auto``. A run
that wants ``hybrid`` or ``disaggregated`` on a fixed layout gets it here:

- `hybrid_layout`: one component (the rollout) on the first half of the devices, rounded up,
  every other component on the rest, taking turns there;
- `disaggregated_layout`: each component on devices of its own, one device for each light
  component and the spare devices dealt to the heavy ones in turn.

`check_nesting`: two components may share devices only when their sets are equal
(collocated) or nested (hybrid); partly overlapping sets have no execution a runtime can
give them.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlinf.sched.errors import PlacementError
from rlinf.sched.placement import (
    ComponentPlacement,
    Placement,
    derive_mode,
    format_devices,
    parse_placement,
)

__all__ = ["check_nesting", "devices_named", "disaggregated_layout", "hybrid_layout"]


def disaggregated_layout(components: Sequence[str], num_devices: int, *,
                         heavy: Sequence[str] = ()) -> Placement:
    """Each of `components` on devices of its own; the spare devices go to the `heavy`
    ones in turn (to the others when none is heavy)."""
    if num_devices < len(components):
        raise PlacementError(f"disaggregated needs a device for each of the {len(components)} "
                             f"components ({', '.join(components)}), the cluster has "
                             f"{num_devices}")
    big = [c for c in heavy if c in components]
    light = [c for c in components if c not in big]
    sizes = dict.fromkeys(components, 1)
    for i in range(num_devices - len(components)):
        sizes[big[i % len(big)] if big else light[i % len(light)]] += 1
    placed: dict[str, ComponentPlacement] = {}
    start = 0
    for name in [*big, *light]:
        placed[name] = ComponentPlacement(name, tuple(range(start, start + sizes[name])))
        start += sizes[name]
    ordered = {name: placed[name] for name in components}
    return Placement(ordered, derive_mode(ordered.values()), num_devices)


def hybrid_layout(components: Sequence[str], num_devices: int, *, apart: str) -> Placement:
    """`apart` on devices ``0..ceil(n/2)-1``, every other component on the rest."""
    if num_devices < 2 or apart not in components:
        raise PlacementError(f"hybrid needs {apart!r} among the components and at least 2 "
                             f"devices; the cluster has {num_devices}")
    split = (num_devices + 1) // 2
    own, rest = tuple(range(split)), tuple(range(split, num_devices))
    placed = {name: ComponentPlacement(name, own if name == apart else rest)
              for name in components}
    return Placement(placed, derive_mode(placed.values()), num_devices)


def check_nesting(placement: Placement) -> None:
    """Refuse two components whose device sets only partly overlap."""
    items = list(placement)
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            sa, sb = set(a.devices), set(b.devices)
            if sa & sb and not (sa <= sb or sb <= sa):
                raise PlacementError(
                    f"device sets must be equal (collocated), disjoint (disaggregated) or "
                    f"nested (hybrid); {a.component} ({format_devices(a.devices)}) and "
                    f"{b.component} ({format_devices(b.devices)}) only partly overlap on "
                    f"device(s) {format_devices(sa & sb)}")


def devices_named(spec: str, components: Sequence[str]) -> int:
    """Devices an explicit placement `spec` names (its highest index + 1; 0 for a mode or a
    spec that does not parse): a run joining a Ray cluster counts them before it discovers
    the cluster, whose other nodes may hold them."""
    if spec.strip().lower() in ("collocated", "hybrid", "disaggregated", "auto"):
        return 0
    try:
        parsed = parse_placement(spec, components=components, num_devices=1 << 16)
    except PlacementError:
        return 0
    return 1 + max((d for part in parsed for d in part.devices), default=-1)
