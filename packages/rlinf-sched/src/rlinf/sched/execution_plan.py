"""`ExecutionPlan`: what the planner decides, in a form workers can load.

A plan holds the placement (devices per component), the micro-batch of each component and
the granularity of each edge (items per message, equal to the consumer's micro-batch), the
simulated iteration time and utilisation, and the execution mode. `PlanResult` adds the
ranked alternatives and the best fixed-mode baselines. Both round-trip through JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlinf.sched.errors import PlacementError, PlanningError
from rlinf.sched.placement import ExecutionMode, Placement

__all__ = ["PLAN_FORMAT", "ExecutionPlan", "PlanResult"]

PLAN_FORMAT = "rlinf-plan/1"


@dataclass(frozen=True)
class ExecutionPlan:
    """One priced way to run the workflow."""

    placement: Placement
    micro_batch: Mapping[str, int]
    """Items per call of each component."""
    granularity: Mapping[str, int]
    """Items per message on each edge ``"src->dst"`` (the consumer's micro-batch)."""
    predicted_time: float
    """Simulated seconds per iteration."""
    utilisation: float
    """Simulated compute utilisation of the cluster's devices, in [0, 1]."""
    label: str = ""
    """How the planner found it (``"collocated"``, ``"disaggregated"``, ``"hybrid"``, ...)."""
    parallelism: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Per cut trainer (a `rlinf.sched.TrainerCost` component): its tensor, pipeline and data
    parallel degrees on its devices (``{"actor": {"tensor": 2, "pipeline": 1, "data": 4}}``)."""

    @property
    def mode(self) -> ExecutionMode:
        """Execution mode implied by the placement."""
        return self.placement.mode

    @property
    def spec(self) -> str:
        """The placement in the compact syntax."""
        return self.placement.to_spec()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict; `from_dict` reads it back."""
        return {
            "mode": self.mode.value,
            "spec": self.spec,
            "placement": self.placement.to_dict(),
            "micro_batch": dict(self.micro_batch),
            "granularity": dict(self.granularity),
            "predicted_time": self.predicted_time,
            "utilisation": self.utilisation,
            "label": self.label,
            "parallelism": {k: dict(v) for k, v in self.parallelism.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecutionPlan:
        """Read a dict written by `to_dict`; PlanningError if it is malformed."""
        try:
            return cls(
                placement=Placement.from_dict(data["placement"]),
                micro_batch={str(k): int(v) for k, v in data["micro_batch"].items()},
                granularity={str(k): int(v) for k, v in data["granularity"].items()},
                predicted_time=float(data["predicted_time"]),
                utilisation=float(data["utilisation"]),
                label=str(data.get("label", "")),
                parallelism={str(k): {str(d): int(n) for d, n in v.items()}
                             for k, v in data.get("parallelism", {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError, PlacementError) as exc:
            raise PlanningError(f"invalid execution plan ({type(exc).__name__}: {exc}): expected "
                                "the dict written by ExecutionPlan.to_dict") from exc


@dataclass(frozen=True)
class PlanResult:
    """The planner's answer: best plan first, alternatives, and fixed-mode baselines."""

    ranked: tuple[ExecutionPlan, ...]
    """Distinct plans, fastest first; ``ranked[0]`` is the chosen plan."""
    baselines: Mapping[str, ExecutionPlan] = field(default_factory=dict)
    """Best plan of each fixed mode the planner considered (``"collocated"``,
    ``"disaggregated"``), when feasible."""
    evaluated: int = 0
    """Simulations run."""
    seconds: float = 0.0
    """Wall time spent planning."""

    @property
    def best(self) -> ExecutionPlan:
        """The chosen plan."""
        return self.ranked[0]

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict with the format tag."""
        return {
            "format": PLAN_FORMAT,
            "best": self.best.to_dict(),
            "alternatives": [p.to_dict() for p in self.ranked[1:]],
            "baselines": {k: p.to_dict() for k, p in self.baselines.items()},
            "evaluated": self.evaluated,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanResult:
        """Read a dict written by `to_dict`."""
        if not isinstance(data, Mapping) or data.get("format") != PLAN_FORMAT:
            raise PlanningError(f"not a plan document: expected format {PLAN_FORMAT!r}")
        try:
            ranked = (ExecutionPlan.from_dict(data["best"]),
                      *(ExecutionPlan.from_dict(p) for p in data.get("alternatives", [])))
            baselines = {str(k): ExecutionPlan.from_dict(v)
                         for k, v in data.get("baselines", {}).items()}
            return cls(ranked, baselines, int(data.get("evaluated", 0)),
                       float(data.get("seconds", 0.0)))
        except (KeyError, TypeError, AttributeError) as exc:
            raise PlanningError(f"invalid plan document: {exc}") from exc

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan document as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PlanResult:
        """Read a plan document written by `save`."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise PlanningError(f"cannot read plan file {str(path)!r}: {exc}") from exc
        return cls.from_dict(data)
