"""`ReasoningFlow`: the reasoning workflow (`rlinf_reasoning.workflow.declare`) running on
the library's flow runtime, plus what only this task adds.

`rlinf.workers.flow.FlowRun` launches the components where the plan puts them, wires one
channel per edge (owned by its consumer), runs each iteration as timed phases with the
device lock, syncs weights and tears everything down. The rollout draws its own prompts from
the run's problem source, so the driver passes control only. What this module adds is the
task's view of an iteration (reward, accuracy, response length, throughput — pooled over
ranks from the sums each rank returns), held-out evaluation, checkpoints of the actor, and
a probe that checks the weight sync by comparing log-probs.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog

from rlinf.envs.math import MathProblem
from rlinf.sched import Cluster, ExecutionPlan
from rlinf.workers import flow as rf
from rlinf.workers.errors import ConfigError
from rlinf.workers.reasoning import ProblemSource, draw_seed
from rlinf.workers.rollout import RolloutBatch, SamplingConfig
from rlinf.workers.runtime import PER_RANK_ALL, RANK_ZERO, split_value
from rlinf.workers.telemetry import Span
from rlinf_reasoning.models import export_for_engine
from rlinf_reasoning.spec import FlowSpec
from rlinf_reasoning.workflow import declare

__all__ = ["Evaluation", "ReasoningFlow", "StepResult"]

_log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class StepResult:
    """What one iteration did."""

    step: int
    """The iteration's index."""
    metrics: Mapping[str, float]
    """Reward, accuracy, losses, KL, entropy, clip fraction, grad norm, response length,
    throughput and per-component seconds (see `ReasoningFlow.step`)."""
    seconds: float
    """Wall time from the rollout's start to the synced weights."""
    samples: int
    """Generated responses."""
    tokens: int
    """Generated response tokens."""
    spans: Sequence[Span] = ()
    """One track per worker rank, one span per stage and micro-batch (empty without trace)."""
    onloads: int = 0
    """Onloads the device lock ran during the iteration, summed over every worker process
    (its context switches; 0 without a lock)."""


@dataclass(frozen=True)
class Evaluation:
    """A held-out evaluation (`ReasoningFlow.evaluation`)."""

    accuracy: float
    """Greedy accuracy over the problems."""
    samples: tuple[dict[str, Any], ...]
    """The first responses: ``prompt``, ``response``, ``answer``, ``reward``."""
    tools: Mapping[str, float] = field(default_factory=dict)
    """With tools: ``calls_per_answer`` and ``error_rate`` (the share of calls that
    returned an error) over the problems; else empty."""


class ReasoningFlow:
    """One launched run of the reasoning workflow (see the module docstring)."""

    def __init__(self, spec: FlowSpec, run: rf.FlowRun, *, problems: ProblemSource, trace: bool,
                 exported: tempfile.TemporaryDirectory[str] | None) -> None:
        self.spec = spec
        self.run = run
        self.problems = problems
        self.trace = trace
        self._exported = exported

    @classmethod
    def launch(cls, spec: FlowSpec, plan: ExecutionPlan, *, problems: ProblemSource,
               cluster: Cluster | None = None, trace: bool = False) -> ReasoningFlow:
        """Start the components where ``plan.placement`` puts them; the rollout reads each
        iteration's prompts from `problems` (``problems(step, groups)``). A plan that chose
        the actor's Megatron cut (``actor.cut=auto``) runs that cut (`FlowSpec.for_plan`)."""
        spec = spec.for_plan(plan)
        path, exported = export_for_engine(spec)
        flow = declare(spec, problems=problems, trace=trace, engine_model_path=path)
        try:
            run = rf.FlowRun.launch(flow, plan, cluster=cluster, timeout=spec.timeout)
        except BaseException:
            if exported is not None:
                exported.cleanup()
            raise
        _log.info("reasoning_flow_launched", placement=plan.spec, mode=plan.mode.value,
                  transport=run.weight_transports[0])
        return cls(spec, run, problems=problems, trace=trace, exported=exported)

    @property
    def plan(self) -> ExecutionPlan:
        """The plan the flow runs."""
        return self.run.plan

    @property
    def groups(self) -> Mapping[str, Any]:
        """The worker group of each component."""
        return self.run.groups

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
        record = records[0]
        rollout, reward = record.rank_metrics["rollout"], record.rank_metrics["reward"]
        responses = sum(r["responses"] for r in rollout)
        tokens = sum(r["response_tokens"] for r in rollout)
        scored = max(sum(r["responses"] for r in reward), 1.0)
        seconds = sum(r.seconds for r in records)
        synced = [p.seconds for r in records for p in r.phases if not p.is_component]
        trained = [r for r in records if "actor" in r.rank_metrics]
        metrics: dict[str, float] = {
            "reward/mean": sum(r["reward_sum"] for r in reward) / scored,
            "reward/accuracy": sum(r["correct"] for r in reward) / scored,
            "reward/pass_at_group": sum(r["groups_solved"] for r in reward)
            / max(sum(r["groups"] for r in reward), 1.0),
            "reward/verify_timeouts": sum(r["verify_timeouts"] for r in reward),
            **{f"reward/fn/{key.partition('/')[2]}": sum(r.get(key, 0.0) for r in reward) / scored
               for key in sorted({k for r in reward for k in r if k.startswith("term_sum/")})},
            **_rollout_tool_metrics(rollout, responses),
            "rollout/response_length": tokens / max(responses, 1.0),
            "rollout/stopped_fraction": sum(r["stopped"] for r in rollout) / max(responses, 1.0),
            "throughput/samples_per_s": responses / seconds,
            "throughput/tokens_per_s": tokens / seconds,
            "time/step": seconds,
            "time/iteration_before_sync": sum(r.metrics["time/dataflow"] for r in records),
            "time/weight_sync": sum(synced),
            **{f"time/{name}": sum(r.metrics.get(f"time/{name}", 0.0) for r in records)
               for name in self.run.flow.names},
            **({key: value for key, value in trained[-1].metrics.items()
                if key.startswith("actor/")} if trained else {}),
        }
        if self.spec.actor.lora is not None:  # what the adapters' sync moves
            metrics["weight_sync/bytes"] = float(self.groups["actor"].call(
                "last_export_bytes", spec=RANK_ZERO))
        if self.spec.sync_check:
            metrics.update(self.check_sync(self.problems(step, self.spec.prompts_per_step)))
        return StepResult(step=step, metrics=metrics, seconds=seconds,
                          samples=int(responses), tokens=int(tokens),
                          spans=self.drain_spans() if self.trace else [],
                          onloads=self.onloads(since=wall_start))

    def sync_weights(self) -> float:
        """Sync the actor's weights into the rollout (and inference) now; seconds taken."""
        return self.run.sync_weights()

    def check_sync(self, problems: Sequence[MathProblem], *, probes: int = 4) -> dict[str, float]:
        """Largest |log-prob difference| between the rollout engine and the trainer (and the
        inference role) on responses the rollout samples for a few `problems`: ~0 after a
        correct sync, large if a bucket was lost or misnamed."""
        self._check_open()
        sampling = SamplingConfig(
            max_new_tokens=self.spec.rollout.sampling.max_new_tokens,
            temperature=self.spec.rollout.sampling.temperature,
            seed=draw_seed(self.spec.seed, 0, 0, purpose=1))
        batch: RolloutBatch = self.groups["rollout"].call(
            "generate_batch", list(problems[:probes]), sampling=sampling, spec=RANK_ZERO)
        mask = batch.response_mask.bool()
        trainer = self.groups["actor"].call("log_probs", batch)[0]
        out = {"weight_sync/logprob_max_abs_diff":
               float((trainer - batch.rollout_log_probs)[mask].abs().max())}
        if self.spec.recompute_logprobs:
            scored: RolloutBatch = self.groups["inference"].call("log_probs", batch,
                                                                 spec=RANK_ZERO)
            assert scored.old_log_probs is not None
            out["weight_sync/inference_logprob_max_abs_diff"] = float(
                (scored.old_log_probs - trainer)[mask].abs().max())
        return out

    # -- evaluation and checkpoints --------------------------------------------------------

    def evaluate(self, problems: Sequence[MathProblem]) -> float:
        """Held-out greedy accuracy of the current weights (`evaluation`)."""
        return self.evaluation(problems).accuracy

    def evaluation(self, problems: Sequence[MathProblem], *, samples: int = 0) -> Evaluation:
        """Held-out greedy accuracy of the current weights, and the first `samples`
        responses with their rewards: the rollout ranks answer their share of `problems`,
        the reward ranks score the answers."""
        self._check_open()
        if not problems:
            return Evaluation(0.0, ())
        rollout, reward = self.groups["rollout"], self.groups["reward"]
        ranks = rollout.world_size
        batches = rollout.call(
            "greedy_batch", split_value(list(problems), ranks),
            max_new_tokens=[self.spec.rollout.sampling.max_new_tokens] * ranks,
            spec=PER_RANK_ALL, timeout=self.spec.timeout)
        results = reward.call("evaluate", split_value(list(batches), reward.world_size),
                              samples=[samples] * reward.world_size, spec=PER_RANK_ALL,
                              timeout=self.spec.timeout)
        kept = [sample for _, _, rank_samples in results for sample in rank_samples]
        return Evaluation(float(sum(correct for correct, _, _ in results) / len(problems)),
                          tuple(kept[:samples]), tools=_tool_use(batches))

    def save(self, directory: Path) -> None:
        """Model, optimizer (+ critic), RNG and step of every actor rank under `directory`.

        Rollout, reward and inference keep no state of their own: their weights come from
        the actor and their random draws from ``(seed, step, index)``."""
        self._check_open()
        self.groups["actor"].call("save", str(Path(directory) / "actor"),
                                  timeout=self.spec.timeout)

    def load(self, directory: Path) -> None:
        """Restore `save`'s state, then sync the restored weights to rollout and inference."""
        self._check_open()
        folder = Path(directory) / "actor"
        if not folder.is_dir():
            raise ConfigError(f"no flow checkpoint in {directory} (expected {folder}); save "
                              "one with ReasoningFlow.save")
        self.groups["actor"].call("load", str(folder), timeout=self.spec.timeout)
        self.sync_weights()

    # -- traces and lifecycle ----------------------------------------------------------------

    def onloads(self, *, since: float) -> int:
        """Onloads the device lock ran in every rank since Unix time `since`."""
        return self.run.onloads(since=since)

    def drain_spans(self) -> list[Span]:
        """Spans every rank recorded since the last drain."""
        return self.run.drain_spans()

    def _check_open(self) -> None:
        if self.run.closed:
            raise rf.FlowClosedError("this ReasoningFlow is closed (after close() or a dead "
                                     "worker); launch a new one and load the last checkpoint")

    def close(self, *, kill: bool = False) -> None:
        """Stop the run (`kill`: without shutdown hooks, for ranks that may be stuck) and
        remove the model folder exported for the engine."""
        self.run.close(kill=kill)
        if self._exported is not None:
            with contextlib.suppress(OSError):
                self._exported.cleanup()
            self._exported = None

    def __enter__(self) -> ReasoningFlow:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(kill=exc is not None)


def _tool_use(batches: Sequence[RolloutBatch | None]) -> dict[str, float]:
    """Tool calls per answer and the share of calls that failed, over `batches` (empty
    when their responses are single-turn)."""
    used = [b for b in batches if b is not None and b.tool_calls is not None]
    if not used:
        return {}
    answers = sum(b.num_rows for b in used)
    calls = errors = 0.0
    for b in used:
        assert b.tool_calls is not None and b.tool_errors is not None
        calls += float(b.tool_calls.sum())
        errors += float(b.tool_errors.sum())
    return {"calls_per_answer": calls / max(answers, 1), "error_rate": errors / calls if calls
            else 0.0}


def _rollout_tool_metrics(rollout: Sequence[Mapping[str, float]],
                          responses: float) -> dict[str, float]:
    """``rollout/tool_*`` of a multi-turn step (empty for single-turn responses)."""
    if not rollout or "tool_calls" not in rollout[0]:
        return {}
    calls = sum(r["tool_calls"] for r in rollout)
    return {"rollout/turns": sum(r["turns"] for r in rollout) / max(responses, 1.0),
            "rollout/tool_calls_per_response": calls / max(responses, 1.0),
            "rollout/tool_error_rate": sum(r["tool_errors"] for r in rollout) / calls
            if calls else 0.0,
            "rollout/tool_seconds": sum(r["tool_seconds"] for r in rollout),
            "rollout/tool_tokens_per_response": sum(r["tool_tokens"] for r in rollout)
            / max(responses, 1.0)}
