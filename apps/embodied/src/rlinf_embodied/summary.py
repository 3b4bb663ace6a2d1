"""`RunSummary`: what a finished embodied run prints and writes to ``summary.json``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlinf.workers.training.report import RunReport, shown

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


@dataclass(frozen=True, kw_only=True)
class RunSummary(RunReport):
    """The outcome of one run: the evaluations before and after, against the task's
    thresholds, and the env steps taken."""

    title: ClassVar[str] = "rlinf-embodied"
    unit: ClassVar[str] = "iteration"

    task: str
    """The env id."""
    algorithm: str
    """ppo or grpo."""
    eval_return_before: float
    """Mean evaluation return of the initial policy."""
    eval_return_after: float
    """Mean evaluation return of the trained policy."""
    success_before: float | None = None
    """Evaluation success rate of the initial policy (tasks with a success signal)."""
    success_after: float | None = None
    """Evaluation success rate of the trained policy."""
    target_return: float | None = None
    """The return the task had to reach."""
    target_success_rate: float | None = None
    """The success rate the task had to reach."""
    target_reached: bool | None = None
    """Whether the trained policy met the thresholds (None: the task sets none)."""
    env_steps: int = 0
    """Env steps taken in training."""
    env_steps_per_s: float = 0.0
    """Env steps per second of training wall time."""
    policy_lag: int = 0
    """``algorithm.policy_lag``: 1 when rollouts ran beside the previous update."""

    def result_rows(self) -> list[tuple[str, str]]:
        if self.target_reached is None:
            verdict = "no threshold set for this task"
        else:
            wanted = [*([f"return >= {self.target_return:g}"] if self.target_return is not None
                        else []),
                      *([f"success rate >= {self.target_success_rate:g}"]
                        if self.target_success_rate is not None else [])]
            verdict = (" and ".join(wanted) + ": "
                       + ("REACHED" if self.target_reached else "NOT reached"))
        return [
            ("task", f"{self.task} ({self.algorithm})"
             + (", rollout beside the previous update (policy_lag=1)" if self.policy_lag
                else "")),
            ("evaluation return", f"{self.eval_return_before:.1f} -> {self.eval_return_after:.1f}"),
            ("threshold", verdict),
            ("success rate", f"{shown(self.success_before, '.2f')} -> "
                             f"{shown(self.success_after, '.2f')}"),
            ("env steps", f"{self.env_steps} ({self.env_steps_per_s:.0f} steps/s)"),
        ]
