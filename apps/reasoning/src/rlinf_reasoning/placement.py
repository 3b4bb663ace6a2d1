"""The app's ``placement`` setting → a validated `rlinf.sched.Placement`.

``collocated``, ``auto`` and explicit specs go through `rlinf.sched.parse_placement`;
``hybrid`` and ``disaggregated`` get the fixed layouts of `rlinf.sched.layouts` (the rollout
apart in hybrid; rollout and actor share the spare devices when disaggregated), so every
mode runs without profiling. Fixed placements keep `rlinf.sched.layouts.check_nesting`.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlinf.sched import ExecutionMode, Placement, PlacementError, parse_placement
from rlinf.sched.layouts import check_nesting, disaggregated_layout, hybrid_layout
from rlinf_reasoning.errors import InvalidConfigError

__all__ = ["HEAVY_COMPONENTS", "resolve_placement"]

HEAVY_COMPONENTS = ("rollout", "actor")
"""Components that get the spare devices of a disaggregated split (rollout first)."""

_ALLOWED = ("'collocated', 'disaggregated', 'hybrid', 'auto', or a spec naming every component "
            "once, e.g. 'rollout: 0, actor,reward,inference: 1'")


def resolve_placement(spec: str, components: Sequence[str], num_devices: int) -> Placement:
    """The placement `spec` means on a cluster of `num_devices` devices (AUTO for ``auto``).

    Raises:
        InvalidConfigError: naming the spec and what is wrong (syntax, unknown or missing
            component, a device index the cluster lacks, partial overlap, too few devices).
    """
    keyword = spec.strip().lower()
    try:
        if keyword == "disaggregated":
            return disaggregated_layout(components, num_devices, heavy=HEAVY_COMPONENTS)
        if keyword == "hybrid":
            return hybrid_layout(components, num_devices, apart="rollout")
        placement = parse_placement(spec, components=components, num_devices=num_devices)
        if placement.mode is not ExecutionMode.AUTO:
            check_nesting(placement)
    except PlacementError as exc:
        fix = {"disaggregated": f"set cluster.cpu_slots={len(components)} to oversubscribe "
                                "the CPU, or use a hybrid spec such as 'rollout: 0, "
                                "actor,reward,inference: 1'",
               "hybrid": "use 'collocated', or set cluster.cpu_slots=2"}.get(keyword, _ALLOWED)
        raise InvalidConfigError("placement", spec, f"{fix} ({exc})") from exc
    return placement
