"""The app's ``placement`` setting → a validated `rlinf.sched.Placement`.

``collocated``, ``auto`` and explicit specs go through `rlinf.sched.parse_placement`.
``hybrid`` puts the rollout on the first half of the devices (rounded up) and every other
role, taking turns, on the rest: on two CPU slots ``rollout: 0, reward,inference,actor: 1``.
``disaggregated`` (which the scheduler leaves to the planner) gets a fixed split here: each
component on its own devices, one device for each light component (reward, inference) and
the rest divided between rollout and actor, so the mode can be run without profiling.
Beyond the parser's checks, two components may share devices only if their device sets are
equal (collocated) or nested (hybrid); partially overlapping sets have no execution the
runtime can give them and are rejected.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlinf.sched import (
    ComponentPlacement,
    ExecutionMode,
    Placement,
    PlacementError,
    derive_mode,
    format_devices,
    parse_placement,
)
from rlinf_reasoning.errors import InvalidConfigError

__all__ = [
    "HEAVY_COMPONENTS",
    "disaggregated_placement",
    "hybrid_placement",
    "resolve_placement",
]

HEAVY_COMPONENTS = ("rollout", "actor")
"""Components that get the spare devices of a disaggregated split (rollout first)."""

_KEY = "placement"
_ALLOWED = ("'collocated', 'disaggregated', 'hybrid', 'auto', or a spec naming every component "
            "once, "
            "e.g. 'rollout: 0, actor,reward,inference: 1'")


def disaggregated_placement(components: Sequence[str], num_devices: int) -> Placement:
    """Each component on devices of its own (see the module docstring)."""
    if num_devices < len(components):
        raise InvalidConfigError(
            _KEY, "disaggregated",
            f"at least {len(components)} devices for {len(components)} components "
            f"({', '.join(components)}), but the cluster has {num_devices}: set "
            f"cluster.cpu_slots={len(components)} to oversubscribe the CPU, or use a hybrid "
            "spec such as 'rollout: 0, actor,reward,inference: 1'")
    heavy = [c for c in HEAVY_COMPONENTS if c in components]
    light = [c for c in components if c not in heavy]
    sizes = {c: 1 for c in components}
    spare = num_devices - len(components)
    for i in range(spare):
        sizes[heavy[i % len(heavy)] if heavy else light[i % len(light)]] += 1
    comps: dict[str, ComponentPlacement] = {}
    start = 0
    for name in [*heavy, *light]:
        comps[name] = ComponentPlacement(name, tuple(range(start, start + sizes[name])))
        start += sizes[name]
    ordered = {name: comps[name] for name in components}
    return Placement(ordered, derive_mode(ordered.values()), num_devices)


def hybrid_placement(components: Sequence[str], num_devices: int) -> Placement:
    """The rollout on devices ``0..ceil(n/2)-1``, the other roles collocated on the rest."""
    if num_devices < 2 or "rollout" not in components:
        raise InvalidConfigError(
            _KEY, "hybrid",
            f"a cluster of at least 2 devices (it has {num_devices}): use 'collocated', or set "
            "cluster.cpu_slots=2")
    split = (num_devices + 1) // 2
    rollout = tuple(range(split))
    rest = tuple(range(split, num_devices))
    comps = {name: ComponentPlacement(name, rollout if name == "rollout" else rest)
             for name in components}
    return Placement(comps, derive_mode(comps.values()), num_devices)


def _check_overlaps(placement: Placement, spec: str) -> None:
    items = list(placement)
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            sa, sb = set(a.devices), set(b.devices)
            if sa & sb and not (sa <= sb or sb <= sa):
                raise InvalidConfigError(
                    _KEY, spec,
                    f"device sets that are equal (collocated), disjoint (disaggregated) or "
                    f"nested (hybrid); {a.component} ({format_devices(a.devices)}) and "
                    f"{b.component} ({format_devices(b.devices)}) only partly overlap on "
                    f"device(s) {format_devices(sa & sb)}")


def resolve_placement(spec: str, components: Sequence[str], num_devices: int) -> Placement:
    """The placement `spec` means on a cluster of `num_devices` devices (AUTO for ``auto``).

    Raises:
        InvalidConfigError: naming the spec and what is wrong (syntax, unknown or missing
            component, a device index the cluster lacks, partial overlap, too few devices).
    """
    keyword = spec.strip().lower()
    if keyword == "disaggregated":
        return disaggregated_placement(components, num_devices)
    if keyword == "hybrid":
        return hybrid_placement(components, num_devices)
    try:
        placement = parse_placement(spec, components=components, num_devices=num_devices)
    except PlacementError as exc:
        raise InvalidConfigError(_KEY, spec, f"{_ALLOWED} ({exc})") from exc
    if placement.mode is not ExecutionMode.AUTO:
        _check_overlaps(placement, spec)
    return placement
