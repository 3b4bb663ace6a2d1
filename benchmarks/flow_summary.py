"""The arithmetic of `bench_flow.py`: one row per run, the table, and the verdict.

Pure Python (no torch, no Ray) so it can be unit-tested on its own
(`benchmarks/tests/test_flow_summary.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FIXED_MODES", "FlowRun", "format_table", "summarize"]

FIXED_MODES = ("collocated", "hybrid", "disaggregated")
"""The fixed placements both apps offer; the fourth mode is ``auto``."""


@dataclass(frozen=True)
class FlowRun:
    """One app run at one setting in one mode, as its ``summary.json`` reports it."""

    app: str
    """``"reasoning"`` or ``"embodied"``."""
    setting: str
    """Name of the setting (the overrides it stands for are printed with the table)."""
    mode: str
    """``"collocated"``, ``"hybrid"``, ``"disaggregated"`` or ``"auto"``."""
    measured: float | None = None
    """Median measured seconds per steady iteration."""
    predicted: float | None = None
    """The planner's simulated seconds per iteration of the executed plan."""
    lock_switches: float | None = None
    """Median onloads the device lock performed per steady iteration, all processes."""
    simulated_switches: float | None = None
    """Context switches per iteration in the simulation that gave the prediction."""
    placement: str = ""
    """The placement run (for ``auto``: the plan it chose)."""
    error: str = ""
    """Why the run gave no summary (empty when it did)."""

    @classmethod
    def from_summary(cls, app: str, setting: str, mode: str,
                     summary: Mapping[str, Any]) -> FlowRun:
        """The row of a run's ``summary.json`` (both apps write the same four keys)."""

        def number(key: str) -> float | None:
            value = summary.get(key)
            if value is None or not math.isfinite(float(value)):
                return None
            return float(value)

        return cls(app, setting, mode, measured=number("measured_iteration_s"),
                   predicted=number("predicted_iteration_s"),
                   lock_switches=number("lock_switches_per_iteration"),
                   simulated_switches=number("simulated_switches"),
                   placement=str(summary.get("placement", "")))

    @property
    def prediction_error(self) -> float | None:
        """``|predicted - measured| / measured`` (None without either)."""
        if self.predicted is None or not self.measured:
            return None
        return abs(self.predicted - self.measured) / self.measured

    @property
    def switches_match(self) -> bool:
        """Whether the lock performed as many switches as the simulator priced (False when
        either count is missing)."""
        return (self.lock_switches is not None and self.simulated_switches is not None
                and self.lock_switches == self.simulated_switches)


def _ratio(runs: Sequence[FlowRun]) -> float | None:
    """auto's measured s/iter over the best fixed mode's, in one setting."""
    auto = [r.measured for r in runs if r.mode == "auto" and r.measured is not None]
    fixed = [r.measured for r in runs if r.mode in FIXED_MODES and r.measured is not None]
    if not auto or not fixed:
        return None
    return min(auto) / min(fixed)


def summarize(runs: Sequence[FlowRun], *, load_average: Mapping[str, float]
              ) -> dict[str, Any]:
    """The verdict (the benchmark's last line):

    - ``auto_vs_best_fixed``: max over settings of auto's measured s/iter divided by the
      best fixed mode's (None when no setting has both);
    - ``max_prediction_error``: max over runs with a prediction of the relative error;
    - ``lock_matches_simulator``: true when every run that finished reports both switch
      counts and they are equal;
    - per-setting ratios, the worst runs, ``load_average`` and counts.
    """
    settings: dict[tuple[str, str], list[FlowRun]] = {}
    for run in runs:
        settings.setdefault((run.app, run.setting), []).append(run)
    ratios = {f"{app}/{setting}": ratio for (app, setting), group in settings.items()
              if (ratio := _ratio(group)) is not None}
    errors = {f"{r.app}/{r.setting}/{r.mode}": e for r in runs
              if (e := r.prediction_error) is not None}
    finished = [r for r in runs if not r.error]
    mismatches = [f"{r.app}/{r.setting}/{r.mode}" for r in finished if not r.switches_match]
    return {
        "auto_vs_best_fixed": max(ratios.values()) if ratios else None,
        "max_prediction_error": max(errors.values()) if errors else None,
        "lock_matches_simulator": bool(finished) and not mismatches,
        "auto_vs_best_fixed_per_setting": ratios,
        "worst_prediction": max(errors, key=errors.__getitem__) if errors else None,
        "switch_mismatches": mismatches,
        "load_average": dict(load_average),
        "runs": len(runs),
        "failed": len(runs) - len(finished),
        "predicted": len(errors),
        "settings": len(settings),
    }


def _cell(value: float | None, spec: str, width: int) -> str:
    return f"{value:{width}{spec}}" if value is not None else f"{'-':>{width}s}"


def format_table(runs: Sequence[FlowRun]) -> str:
    """One row per run: predicted and measured s/iter, relative error, switches per
    iteration by the lock and in the simulation, and the placement run."""
    header = (f"{'app':9s} {'setting':14s} {'mode':13s} {'pred s/it':>9s} {'meas s/it':>9s} "
              f"{'rel err':>7s} {'lock sw':>7s} {'sim sw':>6s}  placement")
    lines = [header, "-" * len(header)]
    for r in runs:
        tail = r.placement if not r.error else f"FAILED: {r.error}"
        lines.append(
            f"{r.app:9s} {r.setting:14s} {r.mode:13s} {_cell(r.predicted, '.3f', 9)} "
            f"{_cell(r.measured, '.3f', 9)} {_cell(r.prediction_error, '.1%', 7)} "
            f"{_cell(r.lock_switches, 'g', 7)} {_cell(r.simulated_switches, 'g', 6)}  {tail}")
    return "\n".join(lines)
