"""`RunReport`: the closing summary of a run, printed in one layout and written to
``summary.json`` in the run folder.

The base holds what the runner knows of every run: its length and wall time, the plan it
ran, the predicted against the measured iteration, the device lock's context switches,
``auto``'s trials and the restarts. An app's summary subclasses it with its results and
the rows that show them (`RunReport.result_rows`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from rlinf.workers.training.task import RunOutcome

__all__ = ["SUMMARY_FILE", "RunReport", "format_fixed", "shown"]

SUMMARY_FILE = "summary.json"
"""The summary in the run folder."""
LABEL_WIDTH = 20
"""Width of the label column of the printed summary."""


def shown(value: object, spec: str = ".3f") -> str:
    """`value` formatted, or ``n/a`` when it is no number (None, NaN)."""
    if not isinstance(value, int | float) or math.isnan(value):
        return "n/a"
    return format(value, spec)


@dataclass(frozen=True, kw_only=True)
class RunReport:
    """What a finished run reports about itself (see the module docstring)."""

    title: ClassVar[str] = "run"
    """The heading of the printed summary."""
    unit: ClassVar[str] = "step"
    """What one iteration is called."""

    steps: int
    """Iterations completed, over all sessions of a resumed run."""
    wall_seconds: float
    """Training wall time of all sessions: iterations, evaluations, checkpoints."""
    total_seconds: float
    """This session's wall time from its start (launch and planning included)."""
    mode: str
    """Execution mode of the plan run last (collocated, hybrid, disaggregated)."""
    placement: str
    """Its placement in the compact syntax."""
    predicted_iteration_s: float | None
    """The planner's simulated iteration (null when no profile priced the plan)."""
    measured_iteration_s: float | None
    """Median of the final plan's steady iterations in this session (null without any)."""
    simulated_switches: int | None = None
    """Context switches per iteration in the simulation that gave the prediction."""
    lock_switches_per_iteration: float | None = None
    """Onloads the device lock ran per iteration over every worker process (median of this
    session's steady iterations)."""
    restarts: tuple[str, ...] = ()
    """One line per restart after a worker died (``run.max_restarts``): what died and the
    iteration the run went on from."""
    trials: tuple[Mapping[str, object], ...] = ()
    """``auto``'s trials (``run.trial_plans``): each tried plan's placement, mode, predicted
    and measured seconds per iteration; the launched plan is the fastest measured."""
    run_dir: str = ""
    """Where the run's outputs are."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "restarts", tuple(self.restarts))  # a list when read back
        object.__setattr__(self, "trials", tuple(dict(t) for t in self.trials))

    @staticmethod
    def of_run(outcome: RunOutcome, run_dir: Path) -> dict[str, Any]:
        """The base's fields from the runner's outcome, for an app summary's constructor."""
        choice = outcome.choice
        return {"steps": outcome.steps, "wall_seconds": outcome.wall_seconds,
                "total_seconds": outcome.total_seconds, "mode": choice.plan.mode.value,
                "placement": choice.plan.spec,
                "predicted_iteration_s": outcome.predicted_iteration_s,
                "measured_iteration_s": outcome.measured_iteration_s,
                "simulated_switches": choice.simulation.switches if choice.simulation else None,
                "lock_switches_per_iteration": outcome.lock_switches_per_iteration,
                "restarts": outcome.restarts,
                "trials": tuple(trial.to_dict() for trial in choice.trials),
                "run_dir": str(run_dir)}

    def result_rows(self) -> list[tuple[str, str]]:
        """The app's results, first in the printed summary: (label, value) rows."""
        return []

    def run_rows(self) -> list[tuple[str, str]]:
        """The run's own rows: length, time, plan, trials, outputs, restarts."""
        predicted = ("" if self.predicted_iteration_s is None
                     else f" (predicted {self.predicted_iteration_s:.3f} s)")
        return [
            (f"{self.unit}s", f"{self.steps} in {self.wall_seconds:.1f} s of training "
                              f"(this session {self.total_seconds:.1f} s with its launch)"),
            ("iteration time", f"{shown(self.measured_iteration_s)} s median{predicted}"),
            ("context switches", f"{shown(self.lock_switches_per_iteration, 'g')} per "
                                 f"iteration by the device lock "
                                 f"({shown(self.simulated_switches, 'd')} simulated)"),
            ("mode", f"{self.mode}: {self.placement}"),
            *(("trial", f"{shown(t['measured_s'])} s measured, "
                        f"{shown(t['predicted_s'])} s predicted: {t['plan']}")
              for t in self.trials),
            ("outputs", self.run_dir),
            *(("restart", line) for line in self.restarts),
        ]

    def format(self) -> str:
        """The printed summary: a heading, then one row per line, labels aligned."""
        rows = [*self.result_rows(), *self.run_rows()]
        return "\n".join([f"== {self.title} summary ==",
                          *(f"{label:<{LABEL_WIDTH}}{value}" for label, value in rows)])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)

    def save(self, run_dir: Path) -> Path:
        """Write `SUMMARY_FILE` into `run_dir`."""
        path = run_dir / SUMMARY_FILE
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return path


def format_fixed(value: float, places: int, *, sign: bool = False) -> str:
    """`value` with `places` decimals, halves rounded up, the same way everywhere a run prints
    accuracies and gains: the binary noise of a float (0.3925 computed as 0.39249998, a gain
    of 19.749999999999996 points) is dropped first, so a halfway value never rounds one way
    in one run and the other way in the next."""
    exact = Decimal(repr(round(value, 9)))
    text = str(exact.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))
    if text.startswith("-") and not Decimal(text):
        text = text[1:]  # no "-0.000"
    return f"+{text}" if sign and not text.startswith("-") else text
