"""PPO learns InvertedPendulum-v5 through the pipelined driver (the real program, tiny budget)."""

import statistics

import pytest

from rlinf.workers.embodied import (
    EmbodiedActorConfig,
    EmbodiedActorWorker,
    PolicyRolloutConfig,
    PolicyRolloutWorker,
)
from rlinf.workers.embodied.loop import evaluate_policy, train
from rlinf.workers.env import EnvWorker, EnvWorkerConfig
from rlinf.workers.models import PolicyConfig

from .conftest import CONTEXT

ENV = "InvertedPendulum-v5"
POLICY = PolicyConfig(obs_shape=(4,), action_dim=1)


def _ppo_run(seed: int) -> tuple[float, float, list[float | None]]:
    """(untrained return, trained return, per-iteration returns) of one seed."""
    env = EnvWorker(CONTEXT, config=EnvWorkerConfig(env_name=ENV, num_envs=8,
                                                    pipeline_stages=2, seed=seed))
    policy = PolicyRolloutWorker(CONTEXT, config=PolicyRolloutConfig(policy=POLICY, seed=seed,
                                                                     num_threads=1))
    actor = EmbodiedActorWorker(CONTEXT, config=EmbodiedActorConfig(
        policy=POLICY, seed=seed, epochs=10, num_minibatches=8, num_threads=1))
    untrained = evaluate_policy(POLICY, actor.get_weights(), env_name=ENV, num_episodes=8,
                                max_episode_steps=1000)
    try:
        results = train(env, policy, actor, iterations=45, num_steps=64, schedule="pipelined")
    finally:
        env.shutdown()
    trained = evaluate_policy(POLICY, actor.get_weights(), env_name=ENV, num_episodes=8,
                              max_episode_steps=1000)
    return untrained, trained, [r.episode_return for r in results]


@pytest.mark.slow
def test_ppo_learns_inverted_pendulum():
    # Untrained: the pole falls within ~25 steps. 45 iterations x 512 steps reach 1000 on
    # most seeds, but one PPO run can sit in a dip at its last iteration (seen: 117 for one
    # of 5 seeds; at 30 iterations, 86-284), so the median of three seeds decides.
    runs = [_ppo_run(seed) for seed in (0, 1, 2)]
    untrained = statistics.median(run[0] for run in runs)
    trained = statistics.median(run[1] for run in runs)
    assert trained > max(200.0, 5 * untrained), runs


def test_grpo_learns_inverted_pendulum_from_same_start_groups():
    # 4 groups of 8 envs, each group starting every episode from one state; 100-step cap.
    env = EnvWorker(CONTEXT, config=EnvWorkerConfig(
        env_name=ENV, num_envs=32, pipeline_stages=2, seed=0, same_start_group_size=8,
        max_episode_steps=100))
    policy = PolicyRolloutWorker(CONTEXT, config=PolicyRolloutConfig(policy=POLICY, seed=0,
                                                                     num_threads=1))
    actor = EmbodiedActorWorker(CONTEXT, config=EmbodiedActorConfig(
        policy=POLICY, seed=0, algorithm="grpo", grpo_group_size=8, epochs=4,
        num_minibatches=4, lr=1e-3, num_threads=1))
    untrained = evaluate_policy(POLICY, actor.get_weights(), env_name=ENV, num_episodes=8,
                                max_episode_steps=100)
    try:
        results = train(env, policy, actor, iterations=25, num_steps=100, reset_seed=0)
    finally:
        env.shutdown()
    trained = evaluate_policy(POLICY, actor.get_weights(), env_name=ENV, num_episodes=8,
                              max_episode_steps=100)
    # Untrained ~25; 25 iterations reach the 100-step cap (seen: 100.0).
    assert trained > max(60.0, 2 * untrained), (untrained, trained,
                                                [r.episode_return for r in results])
