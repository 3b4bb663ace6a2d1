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
    picked = rf.shortlist(choice.ranked, limit=run.trial_plans, margin=run.trial_margin)
    if len(picked) < 2:
        return choice
    print(f"auto: {len(picked)} plans priced within {run.trial_margin:.0%} of the best; "
          f"running each for {run.trial_steps} iterations ...", file=out, flush=True)

    def measure(plan: ExecutionPlan) -> list[float]:
        with EmbodiedFlow.launch(spec, plan, cluster=cluster) as flow:
            return [flow.step(step).seconds for step in range(run.trial_steps)]

    trials = rf.try_plans(picked, measure)
    best = rf.fastest(trials)
    print(rf.format_trials(trials, best), file=out)
    repriced = priced(dataclasses.replace(choice, plan=best.plan), choice.profile, workflow,
                      cluster)
    return dataclasses.replace(choice, plan=repriced.plan, simulation=repriced.simulation,
                               trials=trials)
