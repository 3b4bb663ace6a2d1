"""`RewardRole`: scores groups as they arrive and passes them on."""

from __future__ import annotations

from rlinf.workers.reasoning.base import ReasoningRole
from rlinf.workers.reasoning.routing import Routing, pack_group, rank_key
from rlinf.workers.reasoning.setup import RoleSetup
from rlinf.workers.reward import RewardConfig, RewardWorker
from rlinf.workers.rollout.batch import RolloutBatch
from rlinf.workers.runtime import WorkerContext

__all__ = ["RewardRole"]


class RewardRole(ReasoningRole):
    """Reward rank: rule-based rewards (`rlinf.workers.reward.RewardWorker`) per group."""

    def __init__(self, context: WorkerContext, *, setup: RoleSetup, config: RewardConfig) -> None:
        super().__init__(context, setup=setup)
        _, tokenizer = setup.model_factory()
        self.worker = RewardWorker(tokenizer, config=config)

    def process(self, step: int, in_channel: str, out_channel: str, *, routing: Routing,
                granularity: int, next_role: str) -> dict[str, float]:
        """Score this rank's groups of iteration `step` from `in_channel` and put them into
        `out_channel`, keyed by their `next_role` rank ("inference" or "actor").

        Returns summed statistics: responses, correct responses, reward sum, groups with a
        correct response.
        """
        out = self.channel(out_channel)
        route = routing.inference_rank if next_role == "inference" else routing.actor_rank
        totals = {"responses": 0.0, "correct": 0.0, "reward_sum": 0.0, "groups_solved": 0.0}
        for message in self.receive(in_channel, step=step, count=routing.count("reward", self.rank),
                                    group_size=routing.group_size, granularity=granularity):
            with self.turn("reward", step=step, groups=len(message)):
                for index, group in message:
                    scored, stats = self.worker.compute_rewards(group)
                    out.put(pack_group(scored, index=index, step=step), weight=scored.num_rows,
                            key=rank_key(route(index)))
                    totals["responses"] += stats.responses
                    totals["correct"] += stats.accuracy * stats.responses
                    totals["reward_sum"] += stats.mean_reward * stats.responses
                    totals["groups_solved"] += stats.pass_at_group
        return totals

    def score(self, batch: RolloutBatch) -> RolloutBatch:
        """`batch` with rewards (for profiling and probes), in one turn."""
        with self.turn("reward", rows=batch.num_rows):
            scored, _ = self.worker.compute_rewards(batch)
        return scored
