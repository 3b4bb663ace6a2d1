"""`RewardRole`: scores groups as they arrive and passes them on."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rlinf.comm import Channel
from rlinf.workers.flow import FlowChannel, StepContext
from rlinf.workers.reasoning.base import ReasoningRole
from rlinf.workers.reasoning.groups import pack_group
from rlinf.workers.reasoning.setup import RoleSetup
from rlinf.workers.reward import RewardConfig, RewardScorer
from rlinf.workers.rollout.batch import RolloutBatch
from rlinf.workers.runtime import WorkerContext

__all__ = ["RewardRole"]


class RewardRole(ReasoningRole):
    """Reward rank: rule-based rewards (`rlinf.workers.reward.RewardScorer`) per group."""

    def __init__(self, context: WorkerContext, *, setup: RoleSetup,
                 config: RewardConfig | None = None) -> None:
        """`config` None: the math verifier with its defaults."""
        super().__init__(context, setup=setup)
        self.worker = RewardScorer(setup.tokenizer(), config=config or RewardConfig())

    def reward_step(self, ctx: StepContext, *, input_channel: FlowChannel,
                    output_channel: FlowChannel) -> dict[str, float]:
        """Flow entry (`rlinf.workers.flow`): score this rank's groups of iteration
        ``ctx.step`` as they arrive on `input_channel` and pass them on to
        `output_channel`. Returns this rank's accuracy, mean reward and fraction of groups
        with a correct response, and the sums they come from (``responses``, ``correct``,
        ``reward_sum``, ``groups``, ``groups_solved``) so a driver can pool ranks exactly,
        ``verify_timeouts``, the responses the verifier ran out of time on, and
        ``term_sum/<name>``, each reward function's unweighted scores summed."""
        onward = output_channel.units(ctx.items[output_channel.dst])
        messages = self.receive_shard(ctx, input_channel)
        totals = self._score(ctx.step, messages, self.channel(output_channel),
                             key_of=lambda index: output_channel.key_of(index, onward))
        responses, groups = max(totals["responses"], 1.0), max(totals["groups"], 1.0)
        return {"accuracy": totals["correct"] / responses,
                "mean_reward": totals["reward_sum"] / responses,
                "pass_at_group": totals["groups_solved"] / groups, **totals}

    def _score(self, step: int, messages: Iterable[list[tuple[int, RolloutBatch]]],
               out: Channel, *, key_of: Callable[[int], str]) -> dict[str, float]:
        totals = {"responses": 0.0, "correct": 0.0, "reward_sum": 0.0, "groups_solved": 0.0,
                  "groups": 0.0, "verify_timeouts": 0.0}
        for message in messages:
            rows = sum(group.num_rows for _, group in message)
            with self.turn("reward", step=step, groups=len(message)), self.timed_call(rows):
                for index, group in message:
                    scored, stats = self.worker.compute_rewards(group)
                    out.put(pack_group(scored.without_problems(), index=index, step=step),
                            weight=scored.num_rows, key=key_of(index))
                    totals["responses"] += stats.responses
                    totals["correct"] += stats.accuracy * stats.responses
                    totals["reward_sum"] += stats.mean_reward * stats.responses
                    totals["groups_solved"] += stats.pass_at_group
                    totals["groups"] += 1
                    totals["verify_timeouts"] += stats.verify_timeouts
                    for name, mean in stats.terms.items():
                        key = f"term_sum/{name}"
                        totals[key] = totals.get(key, 0.0) + mean * stats.responses
        return totals

    def evaluate(self, batches: Sequence[RolloutBatch | None], *,
                 samples: int = 0) -> tuple[float, int, list[dict[str, Any]]]:
        """``(correct, answered, samples)`` over the responses of `batches` (the rollout's
        greedy responses to held-out problems, `RolloutRole.greedy_batch`), in one turn;
        `samples`: how many of the first responses to return as ``prompt``, ``response``,
        ``answer`` and ``reward`` (texts decoded as the model saw and wrote them)."""
        correct, answered = 0.0, 0
        kept: list[dict[str, Any]] = []
        with self.turn("evaluate", batches=len(batches)):
            for batch in batches:
                if batch is None or batch.num_rows == 0:
                    continue
                scored, stats = self.worker.compute_rewards(batch)
                correct += stats.accuracy * stats.responses
                answered += stats.responses
                if len(kept) < samples:
                    kept += self._samples(scored, samples - len(kept))
        return correct, answered, kept

    def _samples(self, batch: RolloutBatch, count: int) -> list[dict[str, Any]]:
        rows = min(count, batch.num_rows)
        prompts = [self.worker.tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
                   for ids, mask in zip(batch.prompt_ids[:rows].tolist(),
                                        batch.prompt_mask[:rows].tolist(), strict=True)]
        responses = self.worker.decode(batch.select(slice(0, rows)))
        assert batch.rewards is not None
        return [{"prompt": str(prompt), "response": response, "answer": answer,
                 "reward": float(reward)}
                for prompt, response, answer, reward in zip(
                    prompts, responses, batch.answers[:rows], batch.rewards[:rows].tolist(),
                    strict=True)]

    def score(self, batch: RolloutBatch) -> RolloutBatch:
        """`batch` with rewards (for profiling and probes), in one turn."""
        with self.turn("reward", rows=batch.num_rows):
            scored, _ = self.worker.compute_rewards(batch)
        return scored
