"""``auto``'s trials: the plans priced within ``run.trial_margin`` of the best each run for
``run.trial_steps`` steps (throw-away flows, closed before the run starts, as the profile's
probes are), and the fastest as measured is launched (`rlinf.workers.flow.try_plans`)."""

from __future__ import annotations

import dataclasses
from typing import TextIO

from rlinf.sched import Cluster, ExecutionPlan
from rlinf.workers import flow as rf
from rlinf.workers.training import PlanChoice
from rlinf_reasoning.config import ReasoningConfig
from rlinf_reasoning.data import ProblemSource
from rlinf_reasoning.flow import ReasoningFlow
from rlinf_reasoning.planning import predict
from rlinf_reasoning.spec import FlowSpec

__all__ = ["tried_choice"]


def tried_choice(cfg: ReasoningConfig, spec: FlowSpec, cluster: Cluster, source: ProblemSource,
                 choice: PlanChoice, *, out: TextIO) -> PlanChoice:
    """`choice` with its plan replaced by the fastest trial among the plans priced close to
    it (unchanged, untried, when none is: see the module docstring)."""
    run = cfg.run
    if choice.ranked is None or choice.profile is None or run.trial_plans < 2:
        return choice

    def measure(plan: ExecutionPlan) -> list[float]:
        with ReasoningFlow.launch(spec, plan, problems=source, cluster=cluster) as flow:
            return [flow.step(step).seconds for step in range(run.trial_steps)]

    trials = rf.run_trials(choice.ranked.ranked, measure, limit=run.trial_plans,
                           margin=run.trial_margin, steps=run.trial_steps, unit="steps", out=out)
    if not trials:
        return choice
    best = rf.fastest(trials)
    plan, simulation = predict(best.plan, spec, choice.profile, cluster)
    return dataclasses.replace(choice, plan=plan, simulation=simulation, trials=trials)
