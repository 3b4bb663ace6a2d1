"""A reasoning iteration's metrics pool the ranks' sums: per response whatever the split."""

from __future__ import annotations

import pytest
import torch

from rlinf.workers.flow.records import IterationRecord, PhaseRecord
from rlinf.workers.reasoning.metrics import step_metrics, tool_use
from rlinf.workers.rollout import RolloutBatch


def _rollout(responses: float, tokens: float, stopped: float) -> dict[str, float]:
    return {"responses": responses, "response_tokens": tokens, "stopped": stopped}


def _reward(responses: float, correct: float, reward: float) -> dict[str, float]:
    return {"responses": responses, "correct": correct, "reward_sum": reward,
            "groups_solved": correct / 2, "groups": responses / 2, "verify_timeouts": 0.0,
            "term_sum/math": reward}


def _record(step: int, *, actor: dict[str, float] | None = None) -> IterationRecord:
    phases = (PhaseRecord("rollout", 0.0, 1.0, 1.0), PhaseRecord("reward", 1.0, 1.5, 0.5),
              PhaseRecord("actor", 1.5, 3.0, 1.5),
              PhaseRecord("weight_sync:actor", 3.0, 4.0, 1.0))
    ranks = {"rollout": (_rollout(6, 60, 6), _rollout(2, 40, 1)),
             "reward": (_reward(6, 6, 5), _reward(2, 0, 0))}
    if actor is not None:
        ranks["actor"] = (actor,)
    return IterationRecord(step, 4.0, phases,
                           metrics={"time/dataflow": 3.0, "time/rollout": 1.0,
                                    "time/reward": 0.5, "time/actor": 1.5,
                                    **{f"actor/{k}": v for k, v in (actor or {}).items()}},
                           rank_metrics=ranks)


def test_rates_are_per_response_over_all_ranks_not_a_mean_of_rank_rates() -> None:
    metrics = step_metrics([_record(1, actor={"loss": 0.5})], ("rollout", "reward", "actor"))
    assert metrics["reward/accuracy"] == pytest.approx(6 / 8)  # a mean of rates: 0.5
    assert metrics["reward/mean"] == pytest.approx(5 / 8)
    assert metrics["reward/fn/math"] == pytest.approx(5 / 8)
    assert metrics["rollout/response_length"] == pytest.approx(100 / 8)
    assert metrics["rollout/stopped_fraction"] == pytest.approx(7 / 8)
    assert metrics["throughput/samples_per_s"] == pytest.approx(8 / 4.0)
    assert metrics["time/weight_sync"] == pytest.approx(1.0)
    assert metrics["time/iteration_before_sync"] == pytest.approx(3.0)
    assert metrics["actor/loss"] == 0.5
    assert "rollout/turns" not in metrics  # single-turn


def test_a_drained_iteration_adds_its_seconds_and_keeps_the_latest_update() -> None:
    records = [_record(1, actor={"loss": 0.5}), _record(1, actor={"loss": 0.25})]
    metrics = step_metrics(records, ("rollout", "reward", "actor"))
    assert metrics["time/step"] == pytest.approx(8.0)
    assert metrics["actor/loss"] == 0.25
    assert metrics["time/actor"] == pytest.approx(3.0)


def test_tool_use_counts_calls_per_answer_and_failed_calls() -> None:
    def batch(calls: list[int], errors: list[int]) -> RolloutBatch:
        rows = len(calls)
        ids = torch.zeros(rows, 2, dtype=torch.long)
        return RolloutBatch(prompt_ids=ids, prompt_mask=torch.ones_like(ids),
                            response_ids=ids, response_mask=torch.ones_like(ids),
                            rollout_log_probs=torch.zeros(rows, 2),
                            stopped=torch.ones(rows, dtype=torch.bool), answers=("1",) * rows,
                            group_size=1, tool_mask=torch.zeros(rows, 2, dtype=torch.bool),
                            turns=torch.ones(rows), tool_calls=torch.tensor(calls),
                            tool_errors=torch.tensor(errors), tool_seconds=torch.zeros(rows))

    assert tool_use([batch([1, 2], [0, 1]), None, batch([1, 0], [1, 0])]) == {
        "calls_per_answer": pytest.approx(4 / 4), "error_rate": pytest.approx(2 / 4)}
    assert tool_use([None]) == {}
