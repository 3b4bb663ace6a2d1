"""Embodied roles in-process (no Ray): inline rollouts, the env ↔ policy protocol over p2p
messages, actor checkpoints, threads."""

import threading

import numpy as np
import pytest
import torch

from rlinf.comm import Batch, Endpoint, TCPStore, new_token
from rlinf.sched import parse_placement
from rlinf.workers.embodied import EmbodiedActorConfig, PolicyRolloutConfig
from rlinf.workers.embodied.profiling import synthetic_trajectory
from rlinf.workers.embodied.roles import (
    EmbodiedActorRole,
    EnvRole,
    build_rollout_policy,
    episode_means,
    pool_rollout_metrics,
    serve_stages,
)
from rlinf.workers.env import EnvWorkerConfig, Trajectory
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import FlowChannel, PeerTimeoutError, StepContext
from rlinf.workers.flow.peer import PeerChannel
from rlinf.workers.models import PolicyConfig
from rlinf.workers.runtime import WorkerContext
from rlinf.workers.telemetry import TraceRecorder

from .conftest import make_policy
from .reference import run_collocated

POLICY = PolicyConfig(obs_shape=(4,), action_dim=1, hidden_sizes=(16, 16))


def context(role: str, devices: tuple[int, ...] = (0,)) -> WorkerContext:
    return WorkerContext(role=role, rank=0, world_size=1, devices=devices)


def env_config(**options) -> EnvWorkerConfig:
    return EnvWorkerConfig("InvertedPendulum-v5", **{"num_envs": 4, "pipeline_stages": 2,
                                                     "seed": 2, **options})


def test_inline_env_role_equals_collocated_driver_and_records_spans(make_env):
    role = EnvRole(context("env"), config=env_config(),
                   policy=PolicyRolloutConfig(policy=POLICY, seed=5), trace=True)
    try:
        report = role.collect(num_steps=6)
    finally:
        role.shutdown()
    ref = run_collocated(make_env(num_envs=4, pipeline_stages=2, seed=2),
                         build_rollout_policy(context("x"), PolicyRolloutConfig(policy=POLICY,
                                                                                seed=5)),
                         num_steps=6)
    want = Trajectory.concat(ref.trajectories)
    for field in ("obs", "actions", "rewards", "log_probs", "values", "next_values"):
        np.testing.assert_array_equal(getattr(report.trajectory, field), getattr(want, field))
    names = [(s.track, s.name) for s in report.spans]
    assert names.count(("env/0", "env_step")) == 6 * 2  # one per stage group and step
    assert names.count(("env/0", "infer")) == 7 * 2  # plus the bootstrap batches
    assert report.env_steps == 24


def test_env_role_needs_a_policy_peer_or_an_inline_policy():
    role = EnvRole(context("env"), config=env_config())
    ctx = StepContext(step=0, items={"env": 4, "rollout": 4, "actor": 4},
                      ranks={"env": 1, "rollout": 1, "actor": 1},
                      placement=parse_placement("env,rollout,actor: 0",
                                                components=("env", "rollout", "actor"),
                                                num_devices=1),
                      loop_steps={"env": 3, "rollout": 3})
    trainer = FlowChannel("env", "actor", "run/env->actor", "store", consumer_ranks=1)
    try:
        with pytest.raises(ConfigError, match="either a policy peer or an inline policy"):
            role.rollout(ctx, inputs={}, outputs={"actor": trainer})
    finally:
        role.shutdown()


@pytest.fixture
def endpoints(monkeypatch):
    token = new_token()
    monkeypatch.setenv("RLINF_COMM_TOKEN", token.hex())
    with TCPStore.serve(token=token, timeout=60) as store:
        env_ep, policy_ep = Endpoint("env-end", store=store), Endpoint("policy-end", store=store)
        yield env_ep, policy_ep
        env_ep.close()
        policy_ep.close()


def peers(env_ep: Endpoint, policy_ep: Endpoint, *, timeout: float
          ) -> tuple[PeerChannel, PeerChannel]:
    """Each side's end of one edge pair, as `FlowWorker.link` builds them."""
    return (PeerChannel(env_ep, edge="loop", peer="policy-end", timeout=timeout,
                        filed=PeerChannel.mailbox()),
            PeerChannel(policy_ep, edge="loop", peer="env-end", timeout=timeout,
                        filed=PeerChannel.mailbox()))


def test_p2p_messages_carry_the_protocol_like_the_inline_driver(make_env, endpoints):
    env_ep, policy_ep = endpoints
    env_side, policy_side = peers(env_ep, policy_ep, timeout=30)
    policy = make_policy(4, 1, seed=3)
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            serve_stages(policy, links=[(policy_side, policy_side)], num_steps=9,
                         num_stages=2, timeout=30, trace=TraceRecorder("p", enabled=False))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    got = make_env(num_envs=4, pipeline_stages=2, seed=8).rollout(
        num_steps=9, sink=env_side, source=env_side, timeout=30)
    thread.join(timeout=30)
    assert not failure and not thread.is_alive()
    ref = run_collocated(make_env(num_envs=4, pipeline_stages=2, seed=8), make_policy(4, 1, seed=3),
                         num_steps=9)
    a, b = Trajectory.concat(ref.trajectories), Trajectory.concat(got.trajectories)
    for field in ("obs", "actions", "rewards", "log_probs", "values", "next_values"):
        np.testing.assert_array_equal(getattr(b, field), getattr(a, field), err_msg=field)


def test_p2p_messages_file_other_keys_and_time_out(endpoints):
    env_ep, policy_ep = endpoints
    sender, receiver = peers(env_ep, policy_ep, timeout=5)
    sender.put(Batch({"x": np.arange(3)}), key="stage1")
    sender.put(Batch({"x": np.arange(4)}), key="stage0")
    assert len(receiver.get(key="stage0").tensors["x"]) == 4
    assert len(receiver.get(key="stage1").tensors["x"]) == 3  # filed on the way
    with pytest.raises(PeerTimeoutError, match="stage0"):
        receiver.get(key="stage0", timeout=0.2)


def _trajectory(seed: int) -> Trajectory:
    obs = np.random.default_rng(seed).normal(size=(4, 4)).astype(np.float32)
    return synthetic_trajectory(obs, (1,), steps=8, seed=seed)


def test_actor_role_state_resumes_bit_for_bit_with_global_rngs():
    config = EmbodiedActorConfig(policy=POLICY, epochs=2, num_minibatches=4, seed=1)
    first = EmbodiedActorRole(context("actor", (0, 1)), config=config, trace=True)
    report = first.train(_trajectory(0))
    assert [s.name for s in report.spans] == ["train"] and report.seconds > 0
    saved = first.state()
    first.train(_trajectory(1))
    draw = torch.rand(3)
    second = EmbodiedActorRole(context("actor", (0, 1)), config=config)
    torch.manual_seed(123)  # disturb the global generator: load_state must restore it
    second.load_state(saved)
    second.train(_trajectory(1))
    for key, value in first.get_weights().items():
        torch.testing.assert_close(second.get_weights()[key], value, rtol=0, atol=0)
    torch.testing.assert_close(torch.rand(3), draw, rtol=0, atol=0)


def test_roles_run_one_torch_thread_per_device():
    # one process over two devices (ComponentSpec.one_process): its context has both
    actor = EmbodiedActorRole(context("actor", (0, 1)), config=EmbodiedActorConfig(policy=POLICY))
    assert actor.devices == (0, 1) and actor.num_threads == 2
    with actor.turn("train"):  # no device lock configured: a turn only sets threads
        assert torch.get_num_threads() == 2
    env = EnvRole(context("env"), config=env_config(), num_threads=1,
                  policy=PolicyRolloutConfig(policy=POLICY))
    try:
        assert env.num_threads == 1
    finally:
        env.shutdown()
        torch.set_num_threads(1)


def test_measure_components_profiles_every_component_for_the_planner():
    from rlinf.sched import fit_profile
    from rlinf.workers.embodied.profiling import measure_components

    profile = measure_components(
        env=env_config(pipeline_stages=1), rollout=PolicyRolloutConfig(policy=POLICY),
        actor=EmbodiedActorConfig(policy=POLICY, epochs=1, num_minibatches=2),
        rollout_steps=4, batch_sizes=[2, 4], repeats=2, actor_devices=(1,))
    assert {(m.component, m.batch_size) for m in profile.measurements} == {
        ("env", 2), ("env", 4), ("rollout", 2), ("rollout", 4), ("actor", 8), ("actor", 16)}
    assert all(m.seconds > 0 for m in profile.measurements)
    cost = fit_profile(profile)
    assert cost.time("actor", batch_size=16, num_devices=1) > 0
    with pytest.raises(ConfigError, match="batch sizes"):
        measure_components(env=env_config(), rollout=PolicyRolloutConfig(policy=POLICY),
                           actor=EmbodiedActorConfig(policy=POLICY), rollout_steps=4,
                           batch_sizes=[])


def test_inline_env_role_state_restores_env_and_sampling_streams_separately():
    config = env_config(max_episode_steps=7)
    policy = PolicyRolloutConfig(policy=POLICY, seed=5)
    first = EnvRole(context("env"), config=config, policy=policy)
    second = EnvRole(context("env"), config=config, policy=policy)
    try:
        first.collect(num_steps=5)
        saved = first.state()
        assert saved["policy"] is not None and first.policy_state() is not None
        expected = first.collect(num_steps=9).trajectory
        second.load_state({"env": saved["env"], "policy": None})  # env only ...
        second.load_state({"env": None, "policy": saved["policy"]})  # ... then the streams
        got = second.collect(num_steps=9).trajectory
        np.testing.assert_array_equal(got.actions, expected.actions)
        np.testing.assert_array_equal(got.obs, expected.obs)
    finally:
        first.shutdown()
        second.shutdown()


def test_episode_means_pool_the_rollout_sums() -> None:
    sums = {"episodes": 4.0, "return_sum": 10.0, "length_sum": 200.0, "success_sum": 1.0,
            "success_count": 4.0}
    assert episode_means(sums) == {"episodes": 4.0, "episode_return": 2.5,
                                   "episode_length": 50.0, "success_rate": 0.25}
    assert "success_rate" not in episode_means({**sums, "success_count": 0.0})
    assert episode_means({**sums, "episodes": 0.0}) == {"episodes": 0.0}


def test_env_ranks_metrics_pool_into_one_rollout() -> None:
    def rank(episodes: float, seconds: float, step: float) -> dict[str, float]:
        return {"episodes": episodes, "return_sum": 10.0 * episodes, "length_sum": 5.0,
                "success_sum": 0.0, "success_count": episodes, "env_steps": 64.0,
                "rollout_seconds": seconds, "step_seconds": step, "wait_seconds": 0.1}

    pooled = pool_rollout_metrics([rank(1.0, 2.0, 0.5), rank(3.0, 3.0, 1.5)])
    assert pooled["episodes"] == 4.0 and pooled["return_sum"] == 40.0
    assert pooled["env_steps"] == 128.0
    assert pooled["rollout_seconds"] == 3.0  # the slowest rank's wall time
    assert pooled["step_seconds"] == 1.0 and pooled["wait_seconds"] == pytest.approx(0.1)
    assert episode_means(pooled)["episode_return"] == 10.0
    with pytest.raises(ConfigError, match="no env rank"):
        pool_rollout_metrics([])
