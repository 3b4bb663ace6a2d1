"""`ReasoningFlow`: the reasoning workflow (`rlinf_reasoning.workflow.declare`) running on
the library's flow runtime, plus what only this task adds.

`rlinf.workers.flow.FlowRun` launches the components where the plan puts them, wires one
channel per edge (owned by its consumer), runs each iteration as timed phases with the
device lock, syncs weights and tears everything down; `LaunchedFlow` adds the actor's
checkpoints. The rollout draws its own prompts from the run's problem source, so the driver
passes control only. What this module adds is the task's view of an iteration, held-out
evaluation and the weight-sync check (`rlinf.workers.reasoning.metrics`: pooled over ranks
from the sums each rank returns).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from rlinf.envs.math import MathProblem
from rlinf.sched import Cluster, ExecutionPlan
from rlinf.workers import flow as rf
from rlinf.workers.flow.launched import IterationResult, LaunchedFlow
from rlinf.workers.reasoning import ProblemSource, draw_seed
from rlinf.workers.reasoning.metrics import (
    Evaluation,
    greedy_evaluation,
    step_metrics,
    sync_divergence,
)
from rlinf.workers.rollout import SamplingConfig
from rlinf.workers.runtime import RANK_ZERO
from rlinf_reasoning.spec import FlowSpec
from rlinf_reasoning.workflow import declare, run_inputs

__all__ = ["Evaluation", "ReasoningFlow", "StepResult"]

_log = structlog.get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class StepResult(IterationResult):
    """What one iteration did: reward, accuracy, losses, KL, entropy, clip fraction, grad
    norm, response length, throughput and per-component seconds (`ReasoningFlow.step`)."""

    samples: int
    """Generated responses."""
    tokens: int
    """Generated response tokens."""


class ReasoningFlow(LaunchedFlow):
    """One launched run of the reasoning workflow (see the module docstring)."""

    def __init__(self, spec: FlowSpec, run: rf.FlowRun, *, problems: ProblemSource, trace: bool,
                 exported: tempfile.TemporaryDirectory[str] | None) -> None:
        super().__init__(run, trace=trace, on_close=exported.cleanup if exported else None)
        self.spec = spec
        self.problems = problems

    @classmethod
    def launch(cls, spec: FlowSpec, plan: ExecutionPlan, *, problems: ProblemSource,
               cluster: Cluster | None = None, trace: bool = False) -> ReasoningFlow:
        """Start the components where ``plan.placement`` puts them; the rollout reads each
        iteration's prompts from `problems` (``problems(step, groups)``). A plan that chose
        the actor's Megatron cut (``actor.cut=auto``) runs that cut (`FlowSpec.for_plan`)."""
        spec = spec.for_plan(plan)
        path, exported = spec.model.engine_folder(spec.engine)
        try:
            run = rf.FlowRun.launch(declare(spec), plan, cluster=cluster, timeout=spec.timeout,
                                    inputs=run_inputs(problems, engine_model_path=path),
                                    trace=trace)
        except BaseException:
            if exported is not None:
                exported.cleanup()
            raise
        _log.info("reasoning_flow_launched", placement=plan.spec, mode=plan.mode.value,
                  transport=run.weight_transports[0])
        return cls(spec, run, problems=problems, trace=trace, exported=exported)

    @property
    def transport(self) -> str:
        """The actor → rollout weight-sync transport."""
        return self.run.weight_transports[0]

    # -- one iteration -----------------------------------------------------------------------

    def step(self, step: int, *, drain: bool = False) -> StepResult:
        """One iteration: the rollout streams finished groups → reward → inference →
        actor.train → weight sync. With ``algorithm.policy_lag=1`` the actor trains on the
        previous step's responses meanwhile (nothing right after a drain), and `drain` also
        trains this step's before returning (a checkpoint, the last step); the actor's
        metrics are then the latest update's, ``time/actor`` all of the step's. Raises
        `WorkerDiedError` naming a rank that died (the flow is then closed: relaunch it and
        resume from a checkpoint)."""
        wall_start = time.time()
        records = self.run.iteration(step, drain=drain)
        metrics = step_metrics(records, self.run.flow.names)
        rollout = records[0].rank_metrics["rollout"]
        if self.spec.actor.lora is not None:  # what the adapters' sync moves
            metrics["weight_sync/bytes"] = float(self.groups["actor"].call(
                "last_export_bytes", spec=RANK_ZERO))
        if self.spec.sync_check:
            metrics.update(self.check_sync(self.problems(step, self.spec.prompts_per_step)))
        return StepResult(step=step, metrics=metrics, seconds=metrics["time/step"],
                          samples=int(sum(r["responses"] for r in rollout)),
                          tokens=int(sum(r["response_tokens"] for r in rollout)),
                          spans=self.drain_spans(),
                          onloads=self.onloads(since=wall_start))

    def check_sync(self, problems: Sequence[MathProblem], *, probes: int = 4) -> dict[str, float]:
        """`rlinf.workers.reasoning.metrics.sync_divergence` on a few `problems`."""
        self._check_open()
        sampling = SamplingConfig(
            max_new_tokens=self.spec.rollout.sampling.max_new_tokens,
            temperature=self.spec.rollout.sampling.temperature,
            seed=draw_seed(self.spec.seed, 0, 0, purpose=1))
        return sync_divergence(self.groups, problems[:probes], sampling=sampling,
                               inference=self.spec.recompute_logprobs)

    # -- evaluation and checkpoints --------------------------------------------------------

    def evaluate(self, problems: Sequence[MathProblem]) -> float:
        """Held-out greedy accuracy of the current weights (`evaluation`)."""
        return self.evaluation(problems).accuracy

    def evaluation(self, problems: Sequence[MathProblem], *, samples: int = 0) -> Evaluation:
        """Held-out greedy accuracy of the current weights, and the first `samples`
        responses with their rewards (`rlinf.workers.reasoning.metrics.greedy_evaluation`)."""
        self._check_open()
        return greedy_evaluation(self.groups["rollout"], self.groups["reward"], problems,
                                 max_new_tokens=self.spec.rollout.sampling.max_new_tokens,
                                 samples=samples, timeout=self.spec.timeout)
