"""One GRPO iteration through every LLM worker, in process: rollout streams groups into
reward and inference as they finish, the actor trains, weights sync back to the rollout."""

from __future__ import annotations

import copy

import torch

from rlinf.envs.math import ProblemGenerator
from rlinf.workers.actor import ActorConfig, PolicyTrainer
from rlinf.workers.inference import InferenceConfig, LogProbEngine
from rlinf.workers.models import TinyLMConfig, build_char_tokenizer, build_tiny_causal_lm
from rlinf.workers.reward import RewardConfig, RewardScorer
from rlinf.workers.rollout import (
    HFRolloutEngine,
    RolloutBatch,
    RolloutGenerator,
    RolloutGeneratorConfig,
    SamplingConfig,
)
from rlinf.workers.weight_sync import sync_in_process

CONFIG = TinyLMConfig(hidden_size=64, intermediate_size=128, attn_implementation="eager")


def test_one_grpo_iteration_streams_trains_and_syncs():
    tokenizer = build_char_tokenizer()
    policy = build_tiny_causal_lm(CONFIG, seed=0, tokenizer=tokenizer)
    rollout = RolloutGenerator(
        HFRolloutEngine(copy.deepcopy(policy), eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id),
        tokenizer, config=RolloutGeneratorConfig(
            group_size=4, groups_per_micro_batch=2,
            sampling=SamplingConfig(max_new_tokens=4, temperature=1.0, seed=0)))
    # An untrained model never answers right; the format penalty (no number at all) gives
    # its groups reward variance, hence non-zero GRPO advantages.
    reward = RewardScorer(tokenizer, config=RewardConfig(format_penalty=1.0))
    old_policy = LogProbEngine(copy.deepcopy(policy))
    reference = LogProbEngine(copy.deepcopy(policy),
                                config=InferenceConfig(role="reference"))
    actor = PolicyTrainer(policy, config=ActorConfig(parallelism="none", kl_coef=0.01,
                                                   micro_batch_size=4, lr=1e-3))

    ready: list[RolloutBatch] = []

    def downstream(group: RolloutBatch) -> None:
        scored, _ = reward.compute_rewards(group)
        ready.append(reference.annotate(old_policy.annotate(scored)))

    problems = ProblemGenerator().generate(4)
    stats = rollout.rollout(problems, sink=downstream)
    assert stats.groups == len(ready) == 4
    batch = RolloutBatch.concat(ready, pad_token_id=tokenizer.pad_token_id)
    assert batch.rewards is not None and batch.ref_log_probs is not None
    assert batch.rewards.reshape(-1, 4).std(dim=1).max() > 0
    # same weights everywhere before training: the recomputed log-probs equal the rollout's
    torch.testing.assert_close(batch.old_log_probs, batch.rollout_log_probs, atol=1e-5, rtol=0)

    metrics = actor.train(batch)
    assert metrics["kl"] == 0.0 or abs(metrics["kl"]) < 1e-6
    buckets = list(actor.state_dict_for_rollout(bucket_bytes=32_000))
    sync_in_process(buckets, rollout)
    sync_in_process(buckets, old_policy)

    after = old_policy.compute_log_probs(batch)
    assert not torch.allclose(after, batch.old_log_probs, atol=1e-4)  # the policy moved
    regenerated = rollout.generate_batch(problems[:1])
    torch.testing.assert_close(old_policy.compute_log_probs(regenerated),
                               regenerated.rollout_log_probs, atol=1e-5, rtol=0)
