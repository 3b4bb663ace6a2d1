import numpy as np
import pytest

from rlinf.comm import Batch
from rlinf.sched import Onloadable
from rlinf.workers.env import EnvWorkerConfig, Trajectory
from rlinf.workers.errors import ConfigError, ShapeError

from ..embodied.reference import InlinePolicyLink
from .conftest import make_policy


class RecordingLink(InlinePolicyLink):
    """The real inline link, recording the protocol's messages in order."""

    def __init__(self, policy):
        super().__init__(policy)
        self.sent: list[tuple[str, int, bool]] = []

    def put(self, item: Batch, *, key=None) -> None:
        self.sent.append((key, item.meta["step"], item.meta["bootstrap"]))
        super().put(item, key=key)


def test_protocol_sends_every_stage_first_then_one_per_step(make_env):
    env = make_env(num_envs=4, pipeline_stages=2)
    link = RecordingLink(make_policy(4, 1))
    env.rollout(num_steps=3, sink=link, source=link)
    assert link.sent == [
        ("stage0", 0, False), ("stage1", 0, False),
        ("stage0", 1, False), ("stage1", 1, False),
        ("stage0", 2, False), ("stage1", 2, False),
        ("stage0", 3, True), ("stage1", 3, True),
    ]


def test_rollout_collects_trajectories_and_episodes(make_env):
    env = make_env(num_envs=6, pipeline_stages=3, seed=5)
    link = InlinePolicyLink(make_policy(4, 1))
    rollout = env.rollout(num_steps=40, sink=link, source=link)
    assert [t.num_envs for t in rollout.trajectories] == [2, 2, 2]
    traj = Trajectory.concat(rollout.trajectories)
    assert traj.obs.shape == (40, 6, 4) and traj.actions.shape == (40, 6, 1)
    np.testing.assert_array_equal(traj.env_indices, np.arange(6))
    assert rollout.env_steps == 240 and rollout.steps_per_s > 0
    # InvertedPendulum-v5 pays 1 per step but 0 on the step that drops the pole.
    assert rollout.episodes, "expected finished episodes"
    for episode in rollout.episodes:
        assert episode.episode_return == pytest.approx(episode.length - episode.terminated)
    assert int(traj.terminated.sum() + traj.truncated.sum()) == len(rollout.episodes)
    # where an episode goes on, next_values is the following step's value
    cont = ~(traj.terminated | traj.truncated)[:-1]
    np.testing.assert_array_equal(traj.next_values[:-1][cont], traj.values[1:][cont])


def test_rollouts_continue_episodes_and_reset_restarts_them(make_env):
    env = make_env(num_envs=2, seed=3)
    link = InlinePolicyLink(make_policy(4, 1))
    first = env.rollout(num_steps=2, sink=link, source=link)
    second = env.rollout(num_steps=2, sink=link, source=link)
    assert not np.array_equal(second.trajectories[0].obs[0], first.trajectories[0].obs[0])
    env.reset(seed=3)
    again = env.rollout(num_steps=1, sink=link, source=link)
    np.testing.assert_array_equal(again.trajectories[0].obs[0], first.trajectories[0].obs[0])


def test_same_start_blocks_share_initial_states(make_env):
    env = make_env(num_envs=4, same_start_group_size=2, seed=0)
    link = InlinePolicyLink(make_policy(4, 1))
    obs = Trajectory.concat(env.rollout(num_steps=1, sink=link, source=link).trajectories).obs[0]
    np.testing.assert_array_equal(obs[0], obs[1])
    np.testing.assert_array_equal(obs[2], obs[3])
    assert not np.array_equal(obs[0], obs[2])


@pytest.mark.parametrize("threads", [1, 2])
def test_same_start_blocks_step_batched_exactly_as_the_loop(threads):
    """GRPO's same-start env on a task the batched backend knows steps it as one batch, and
    produces what gymnasium's loop does (auto-resets within the run included)."""
    from rlinf.envs.embodied import LoopVectorEnv
    from rlinf.envs.embodied.backends import gym_backend
    from rlinf.envs.embodied.backends.mujoco_batch import MujocoVectorEnv
    from rlinf.workers.env.same_start import block_seeded, make_same_start_env

    config = EnvWorkerConfig(env_name="Hopper-v5", num_envs=4, same_start_group_size=2,
                             seed=3, max_episode_steps=40, threads=threads)
    batched = make_same_start_env(config)
    loop = LoopVectorEnv(block_seeded(gym_backend.make_envs(
        "Hopper-v5", num_envs=4, render_size=(128, 128), max_episode_steps=40,
        env_kwargs={}), 2),
        seed=3, name="Hopper-v5")
    try:
        assert isinstance(batched, MujocoVectorEnv) and batched.threads == threads
        obs_a, _ = batched.reset()
        obs_b, _ = loop.reset()
        np.testing.assert_array_equal(obs_a, obs_b)
        np.testing.assert_array_equal(obs_a[0], obs_a[1])
        actions = np.random.default_rng(0).uniform(-1, 1, (120, 4, 3)).astype(np.float32)
        resets = 0
        for action in actions:
            a, b = batched.step(action), loop.step(action)
            for field in ("obs", "reward", "terminated", "truncated"):
                np.testing.assert_array_equal(getattr(a, field), getattr(b, field), field)
            resets += int(np.sum(a.terminated | a.truncated))
        assert resets > 0
    finally:
        batched.close()
        loop.close()


def test_wrong_action_count_is_a_shape_error(make_env):
    env = make_env(num_envs=4, pipeline_stages=2)
    link = InlinePolicyLink(make_policy(4, 1))
    real_put = link.put

    def drop_a_row(item, *, key=None):
        real_put(Batch({k: v[:1] for k, v in item.tensors.items()}, meta=item.meta), key=key)

    link.put = drop_a_row  # type: ignore[method-assign]
    with pytest.raises(ShapeError, match="stage 0"):
        env.rollout(num_steps=1, sink=link, source=link)


def test_offload_onload_protocol(make_env):
    env = make_env(num_envs=1)
    assert isinstance(env, Onloadable)
    env.offload()
    assert not env.resident
    env.onload()
    assert env.resident


@pytest.mark.parametrize("options", [
    {"num_envs": 0}, {"num_envs": 2, "pipeline_stages": 3},
    {"num_envs": 4, "same_start_group_size": 3},
])
def test_config_rejects_bad_values(options):
    with pytest.raises(ConfigError):
        EnvWorkerConfig(env_name="InvertedPendulum-v5", **options)


def test_rollout_needs_a_step(make_env):
    env = make_env(num_envs=1)
    link = InlinePolicyLink(make_policy(4, 1))
    with pytest.raises(ConfigError):
        env.rollout(num_steps=0, sink=link, source=link)
