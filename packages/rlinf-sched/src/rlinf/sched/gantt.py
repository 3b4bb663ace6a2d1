"""Gantt chart of a simulated iteration: one row per device, one colour per component.

matplotlib is imported only when drawing (``pip install 'rlinf-sched[plot]'``). Clusters with
more devices than `max_rows` are drawn one row per group of consecutive devices that run the
same components (labelled with the device range).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from rlinf.sched.errors import PlanningError
from rlinf.sched.placement import format_devices
from rlinf.sched.simulator import Interval, SimulationResult

__all__ = ["gantt_rows", "plot_gantt"]


def gantt_rows(
    result: SimulationResult, *, num_devices: int, max_rows: int = 64
) -> list[tuple[str, tuple[int, ...]]]:
    """Row labels and the devices each row stands for."""
    if num_devices <= max_rows:
        return [(f"dev {d}", (d,)) for d in range(num_devices)]
    touching: list[set[str]] = [set() for _ in range(num_devices)]
    for iv in result.intervals:
        for d in iv.devices:
            touching[d].add(iv.component)
    rows: list[tuple[str, tuple[int, ...]]] = []
    start = 0
    for d in range(1, num_devices + 1):
        if d == num_devices or touching[d] != touching[start]:
            devs = tuple(range(start, d))
            rows.append((f"dev {format_devices(devs)}", devs))
            start = d
    return rows


def plot_gantt(
    result: SimulationResult,
    path: str | os.PathLike[str],
    *,
    num_devices: int,
    components: Sequence[str],
    title: str = "",
    max_rows: int = 64,
) -> None:
    """Draw the recorded intervals of `result` (simulate with ``record=True``) to a PNG."""
    if not result.intervals:
        raise PlanningError("the simulation has no recorded intervals: simulate with record=True")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise PlanningError("drawing a Gantt chart needs matplotlib: install it with "
                            "`pip install 'rlinf-sched[plot]'`") from exc
    rows = gantt_rows(result, num_devices=num_devices, max_rows=max_rows)
    palette = plt.get_cmap("tab10")
    colours = {name: palette(i % 10) for i, name in enumerate(components)}
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.32 * len(rows)))
    for y, (_, devs) in enumerate(rows):
        first = devs[0]
        spans: dict[tuple[str, str], list[Interval]] = {}
        for iv in result.intervals:
            if first in iv.devices:
                spans.setdefault((iv.component, iv.kind), []).append(iv)
        for (name, kind), ivs in spans.items():
            bars = [(iv.start, iv.end - iv.start) for iv in ivs]
            if kind == "switch":
                ax.broken_barh(bars, (y - 0.4, 0.8), facecolors="0.85", edgecolors="0.4",
                               hatch="//", linewidth=0.3)
            else:
                ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=colours.get(name, "0.5"),
                               edgecolors="white", linewidth=0.2)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_xlim(0, result.iteration_time * 1.01)
    handles = [Patch(facecolor=colours[n], label=n) for n in components]
    if any(iv.kind == "switch" for iv in result.intervals):
        handles.append(Patch(facecolor="0.85", edgecolor="0.4", hatch="//", label="switch"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(title or f"iteration {result.iteration_time:.3g} s, "
                          f"utilisation {result.utilisation:.0%}")
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=110)
    plt.close(fig)
