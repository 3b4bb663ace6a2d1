"""``auto``'s trials: the plans priced within ``run.trial_margin`` of the best each run for
``run.trial_steps`` iterations (throw-away flows with fresh weights, closed before the run
starts, as the profile's probe is), and the fastest as measured is launched
(`rlinf.workers.flow.try_plans`). The launched plan keeps its simulated price as its
prediction."""

from __future__ import annotations

import dataclasses
from typing import TextIO

from rlinf.sched import Cluster, ExecutionPlan, Workflow
from rlinf.workers import flow as rf
from rlinf_embodied.config import AppConfig
from rlinf_embodied.planning import PlanChoice, priced
from rlinf_embodied.workflow import EmbodiedSpec

__all__ = ["tried_choice"]


def tried_choice(cfg: AppConfig, spec: EmbodiedSpec, workflow: Workflow, cluster: Cluster,
                 choice: PlanChoice, *, out: TextIO) -> PlanChoice:
    """`choice` with its plan replaced by the fastest trial among the plans priced close to
    it (unchanged, untried, when none is: see the module docstring)."""
    from rlinf_embodied.flow import EmbodiedFlow

    run = cfg.run
    if choice.profile is None or run.trial_plans < 2:
        return choice

    def measure(plan: ExecutionPlan) -> list[float]:
        with EmbodiedFlow.launch(spec, plan, cluster=cluster) as flow:
            return [flow.step(step).seconds for step in range(run.trial_steps)]

    trials = rf.run_trials(choice.ranked, measure, limit=run.trial_plans,
                           margin=run.trial_margin, steps=run.trial_steps, unit="iterations",
                           out=out)
    if not trials:
        return choice
    best = rf.fastest(trials)
    repriced = priced(dataclasses.replace(choice, plan=best.plan), choice.profile, workflow,
                      cluster)
    return dataclasses.replace(choice, plan=repriced.plan, simulation=repriced.simulation,
                               trials=trials)
