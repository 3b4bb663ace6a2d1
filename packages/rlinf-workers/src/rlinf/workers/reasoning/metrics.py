"""What a reasoning iteration and a held-out evaluation report, pooled over the ranks.

Each rank returns sums (responses, rewards, tokens, tool calls); the metrics are pooled
here from them, so they are per response whatever the placement: `step_metrics` for an
iteration's records, `greedy_evaluation` for held-out accuracy over the rollout and reward
groups, `sync_divergence` for the check that a weight sync landed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlinf.envs.math import MathProblem
from rlinf.workers.flow.records import IterationRecord
from rlinf.workers.rollout import RolloutBatch, SamplingConfig
from rlinf.workers.runtime import PER_RANK_ALL, RANK_ZERO, WorkerGroup, split_value

__all__ = ["Evaluation", "greedy_evaluation", "step_metrics", "sync_divergence", "tool_use"]


def step_metrics(records: Sequence[IterationRecord], components: Sequence[str]
                 ) -> dict[str, float]:
    """Reward, accuracy, response length, tool use, throughput and per-component seconds of
    one iteration (`records`: more than one when a lagged trainer drained), with the
    latest update's ``actor/`` metrics."""
    rollout, reward = records[0].rank_metrics["rollout"], records[0].rank_metrics["reward"]
    responses = sum(r["responses"] for r in rollout)
    tokens = sum(r["response_tokens"] for r in rollout)
    scored = max(sum(r["responses"] for r in reward), 1.0)
    seconds = sum(r.seconds for r in records)
    trained = [r for r in records if "actor" in r.rank_metrics]
    terms = sorted({k for r in reward for k in r if k.startswith("term_sum/")})
    return {
        "reward/mean": sum(r["reward_sum"] for r in reward) / scored,
        "reward/accuracy": sum(r["correct"] for r in reward) / scored,
        "reward/pass_at_group": sum(r["groups_solved"] for r in reward)
        / max(sum(r["groups"] for r in reward), 1.0),
        "reward/verify_timeouts": sum(r["verify_timeouts"] for r in reward),
        **{f"reward/fn/{key.partition('/')[2]}": sum(r.get(key, 0.0) for r in reward) / scored
           for key in terms},
        **_rollout_tool_metrics(rollout, responses),
        "rollout/response_length": tokens / max(responses, 1.0),
        "rollout/stopped_fraction": sum(r["stopped"] for r in rollout) / max(responses, 1.0),
        "throughput/samples_per_s": responses / seconds,
        "throughput/tokens_per_s": tokens / seconds,
        "time/step": seconds,
        "time/iteration_before_sync": sum(r.metrics["time/dataflow"] for r in records),
        "time/weight_sync": sum(p.seconds for r in records for p in r.phases
                                if not p.is_component),
        **{f"time/{name}": sum(r.metrics.get(f"time/{name}", 0.0) for r in records)
           for name in components},
        **({key: value for key, value in trained[-1].metrics.items()
            if key.startswith("actor/")} if trained else {}),
    }


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


def tool_use(batches: Sequence[RolloutBatch | None]) -> dict[str, float]:
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
    return {"calls_per_answer": calls / max(answers, 1),
            "error_rate": errors / calls if calls else 0.0}


@dataclass(frozen=True)
class Evaluation:
    """A held-out evaluation (`greedy_evaluation`)."""

    accuracy: float
    """Greedy accuracy over the problems."""
    samples: tuple[dict[str, Any], ...]
    """The first responses: ``prompt``, ``response``, ``answer``, ``reward``."""
    tools: Mapping[str, float] = field(default_factory=dict)
    """With tools: ``calls_per_answer`` and ``error_rate`` (the share of calls that
    returned an error) over the problems; else empty."""


def greedy_evaluation(rollout: WorkerGroup, reward: WorkerGroup,
                      problems: Sequence[MathProblem], *, max_new_tokens: int,
                      samples: int = 0, timeout: float = 600.0) -> Evaluation:
    """Greedy accuracy of the rollout's current weights on `problems`, and the first
    `samples` responses with their rewards: the rollout ranks answer their share, the
    reward ranks score the answers."""
    if not problems:
        return Evaluation(0.0, ())
    ranks = rollout.world_size
    batches = rollout.call("greedy_batch", split_value(list(problems), ranks),
                           max_new_tokens=[max_new_tokens] * ranks, spec=PER_RANK_ALL,
                           timeout=timeout)
    results = reward.call("evaluate", split_value(list(batches), reward.world_size),
                          samples=[samples] * reward.world_size, spec=PER_RANK_ALL,
                          timeout=timeout)
    kept = [sample for _, _, rank_samples in results for sample in rank_samples]
    return Evaluation(float(sum(correct for correct, _, _ in results) / len(problems)),
                      tuple(kept[:samples]), tools=tool_use(batches))


def sync_divergence(groups: Mapping[str, WorkerGroup], problems: Sequence[MathProblem], *,
                    sampling: SamplingConfig, inference: bool) -> dict[str, float]:
    """Largest |log-prob difference| between the rollout engine and the trainer (and the
    `inference` role, which receives the synced weights when it recomputes old
    log-probs) on responses the rollout samples for `problems`: ~0 after a correct sync,
    large if a bucket was lost or misnamed."""
    batch: RolloutBatch = groups["rollout"].call("generate_batch", list(problems),
                                                 sampling=sampling, spec=RANK_ZERO)
    mask = batch.response_mask.bool()
    trainer = groups["actor"].call("log_probs", batch)[0]
    out = {"weight_sync/logprob_max_abs_diff":
           float((trainer - batch.rollout_log_probs)[mask].abs().max())}
    if inference:
        scored: RolloutBatch = groups["inference"].call("log_probs", batch, spec=RANK_ZERO)
        assert scored.old_log_probs is not None
        out["weight_sync/inference_logprob_max_abs_diff"] = float(
            (scored.old_log_probs - trainer)[mask].abs().max())
    return out
