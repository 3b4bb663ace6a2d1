"""`RunSummary`: what a finished run prints and writes to ``run_dir/summary.json``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["RunSummary", "target_reached"]


def target_reached(*, mean_return: float, success_rate: float | None,
                   target_return: float | None, target_success_rate: float | None
                   ) -> bool | None:
    """Whether an evaluation meets the task's thresholds (None when the task sets none)."""
    checks = []
    if target_return is not None:
        checks.append(mean_return >= target_return)
    if target_success_rate is not None:
        checks.append(success_rate is not None and success_rate >= target_success_rate)
    return all(checks) if checks else None


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else (
        format(value, spec))


@dataclass(frozen=True)
class RunSummary:
    """The outcome of one run."""

    task: str
    """The env id."""
    algorithm: str
    """ppo or grpo."""
    mode: str
    """Execution mode of the plan (collocated, hybrid, disaggregated)."""
    placement: str
    """The plan's placement spec."""
    iterations: int
    """Training iterations completed (over all resumed segments)."""
    eval_return_before: float
    """Mean evaluation return of the initial policy."""
    eval_return_after: float
    """Mean evaluation return of the trained policy."""
    success_before: float | None
    """Evaluation success rate of the initial policy (tasks with a success signal)."""
    success_after: float | None
    """Evaluation success rate of the trained policy."""
    target_return: float | None
    """The return the task had to reach."""
    target_success_rate: float | None
    """The success rate the task had to reach."""
    target_reached: bool | None
    """Whether the trained policy met the thresholds (None: the task sets none)."""
    wall_seconds: float
    """Training wall time (evaluations and checkpoints included, over resumed segments)."""
    env_steps: int
    """Env steps taken in training."""
    env_steps_per_s: float
    """Env steps per second of training wall time."""
    measured_iteration_s: float
    """Median seconds per training iteration (steady ones: the first is left out when there
    are several)."""
    predicted_iteration_s: float | None
    """The planner's simulated seconds per iteration (when a profile was taken)."""
    run_dir: str
    """Where the outputs are."""
    simulated_switches: int | None = None
    """Context switches per iteration in the simulation that gave the prediction."""
    lock_switches_per_iteration: float | None = None
    """Onloads the device lock ran per iteration over every worker process (median of this
    session's steady iterations)."""
    restarts: tuple[str, ...] = ()
    """One line per restart after a worker died (``run.max_restarts``)."""
    policy_lag: int = 0
    """``algorithm.policy_lag``: 1 when rollouts ran beside the previous update (the
    prediction prices that: the actor's input is ready when the iteration starts)."""
    trials: tuple[Mapping[str, object], ...] = ()
    """``auto``'s trials (``run.trial_plans``): each tried plan's placement, mode, predicted
    and measured seconds per iteration; the launched plan is the fastest measured."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "restarts", tuple(self.restarts))  # a list when read back
        object.__setattr__(self, "trials", tuple(dict(t) for t in self.trials))

    def format(self) -> str:
        """The printed summary."""
        if self.target_reached is None:
            verdict = "no threshold set for this task"
        else:
            wanted = []
            if self.target_return is not None:
                wanted.append(f"return >= {self.target_return:g}")
            if self.target_success_rate is not None:
                wanted.append(f"success rate >= {self.target_success_rate:g}")
            verdict = (" and ".join(wanted) + ": "
                       + ("REACHED" if self.target_reached else "NOT reached"))
        predicted = ("" if self.predicted_iteration_s is None else
                     f" (planner predicted {self.predicted_iteration_s:.3f} s)")
        lines = [
            f"== rlinf-embodied summary: {self.task} ({self.algorithm}) ==",
            f"evaluation return   {self.eval_return_before:.1f} -> {self.eval_return_after:.1f}",
            f"threshold           {verdict}",
            f"success rate        {_fmt(self.success_before, '.2f')} -> "
            f"{_fmt(self.success_after, '.2f')}",
            f"iterations          {self.iterations}",
            f"wall time           {self.wall_seconds:.1f} s",
            f"env steps           {self.env_steps} ({self.env_steps_per_s:.0f} steps/s)",
            f"iteration time      {self.measured_iteration_s:.3f} s median{predicted}",
            f"context switches    {_fmt(self.lock_switches_per_iteration, 'g')} per iteration "
            f"by the device lock ({_fmt(self.simulated_switches, 'd')} simulated)",
            f"mode                {self.mode}: {self.placement}"
            + (", rollout beside the previous update (policy_lag=1)" if self.policy_lag else ""),
            *(f"trial               {t['measured_s']:.3f} s measured, "
              f"{t['predicted_s']:.3f} s predicted: {t['plan']}" for t in self.trials),
            f"outputs             {self.run_dir}",
            *(f"restart             {line}" for line in self.restarts),
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)

    def save(self, path: Path) -> Path:
        """Write ``summary.json``."""
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return path
