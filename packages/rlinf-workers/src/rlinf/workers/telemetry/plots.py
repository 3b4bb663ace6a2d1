"""PNG plots of a run: learning curves from metric records, measured vs predicted timelines.

Matplotlib (the `telemetry` extra) is imported when a plot is drawn, with the Agg canvas on
a standalone `Figure`: no pyplot global state, no display needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlinf.workers._extras import require
from rlinf.workers.errors import ConfigError
from rlinf.workers.telemetry.trace import Span

__all__ = ["plot_learning_curve", "plot_timeline"]


def _figure(width: float, height: float) -> Any:
    figure_mod = require("matplotlib.figure", feature="plots", extra="telemetry")
    agg = require("matplotlib.backends.backend_agg", feature="plots", extra="telemetry")
    fig = figure_mod.Figure(figsize=(width, height), layout="constrained")
    agg.FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def plot_learning_curve(
    records: Sequence[Mapping[str, float]], *, ys: Sequence[str], path: Path,
    x: str = "step", title: str = "",
) -> Path:
    """Plot each metric in `ys` against `x`, one panel per metric; returns `path` (PNG).

    Records lacking `x` or a metric are skipped for that metric (metrics logged at different
    intervals share one file). A metric present in no record raises `ConfigError`.
    """
    if not ys:
        raise ConfigError("plot_learning_curve needs at least one metric name in ys=")
    series: dict[str, tuple[list[float], list[float]]] = {}
    for y in ys:
        pts = [(float(r[x]), float(r[y])) for r in records if x in r and y in r]
        if not pts:
            seen = sorted({k for r in records for k in r})
            raise ConfigError(f"no record has both {x!r} and {y!r}; the records hold {seen}")
        series[y] = ([p[0] for p in pts], [p[1] for p in pts])
    fig = _figure(7.0, 2.2 * len(ys) + 0.6)
    axes = fig.subplots(len(ys), 1, sharex=True, squeeze=False)[:, 0]
    for ax, y in zip(axes, ys, strict=True):
        xs, vs = series[y]
        ax.plot(xs, vs, marker="." if len(xs) < 50 else None, linewidth=1.2)
        ax.set_ylabel(y)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel(x)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def _role(track: str) -> str:
    """``"rollout/0"`` → ``"rollout"``: measured ranks and predicted components share colours."""
    return track.split("/", 1)[0]


SWITCH_SPANS = frozenset({"switch", "onload", "offload"})
"""Span names drawn as context switches: the simulator's ``switch`` intervals and the
device-lock turns workers record (``onload``/``offload``)."""


def plot_timeline(path: Path, measured: Sequence[Span], predicted: Sequence[Span] = ()) -> Path:
    """Gantt chart of spans, one row per track: measured above predicted on one time axis.

    Times are seconds from the earliest span of either kind. Bars take the colour of their
    track's role (``"actor/1"`` and the predicted ``"actor"`` match); context switches
    (`SWITCH_SPANS`) are grey and hatched. Returns `path` (PNG).
    """
    if not measured and not predicted:
        raise ConfigError("plot_timeline got no spans; record some with TraceRecorder or "
                          "pass predicted_spans(...)")
    groups = [(label, list(spans)) for label, spans in
              (("measured", measured), ("predicted", predicted)) if spans]
    origin = min(s.start for _label, spans in groups for s in spans)
    roles = sorted({_role(s.track) for _label, spans in groups for s in spans})
    colormaps = require("matplotlib", feature="plots", extra="telemetry").colormaps
    cmap = colormaps["tab20" if len(roles) > 10 else "tab10"]
    colour = {r: cmap(i % cmap.N) for i, r in enumerate(roles)}
    rows = [len({s.track for s in spans}) for _label, spans in groups]
    fig = _figure(10.0, 0.45 * sum(rows) + 1.4 * len(groups) + 0.6)
    axes = fig.subplots(len(groups), 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": [max(r, 1) for r in rows]})[:, 0]
    switched = False
    for ax, (label, spans) in zip(axes, groups, strict=True):
        tracks = sorted({s.track for s in spans})
        row = {t: i for i, t in enumerate(tracks)}
        for s in spans:
            switch = s.name in SWITCH_SPANS
            switched |= switch
            ax.broken_barh([(s.start - origin, max(s.duration, 1e-9))],
                           (row[s.track] - 0.4, 0.8),
                           facecolors="lightgrey" if switch else colour[_role(s.track)],
                           hatch="//" if switch else None, edgecolor="black", linewidth=0.3)
        ax.set_yticks(range(len(tracks)), labels=tracks)
        ax.set_ylim(len(tracks) - 0.5, -0.5)
        ax.set_title(label, loc="left", fontsize="medium")
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1].set_xlabel("seconds")
    patches = require("matplotlib.patches", feature="plots", extra="telemetry")
    handles = [patches.Patch(color=colour[r], label=r) for r in roles[:20]]
    if switched:
        handles.append(patches.Patch(facecolor="lightgrey", hatch="//", edgecolor="black",
                                     label="switch"))
    fig.legend(handles=handles, loc="outside right upper", fontsize="small")
    return _save(fig, path)
