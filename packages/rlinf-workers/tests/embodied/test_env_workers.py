"""Several env workers (ranks) in one flow: they split the envs, a policy rank batches the
env ranks paired with it, and the trainer receives every transition exactly once, in its
env's column and order (replayed against each env's own simulator)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import ray

from rlinf.comm import live_segments, orphaned_segments
from rlinf.sched import Component, Edge, ExecutionPlan, Loop
from rlinf.workers.embodied import PolicyRolloutConfig
from rlinf.workers.embodied.roles import EnvRole, PolicyRole, receive_trajectory
from rlinf.workers.env import EnvWorkerConfig
from rlinf.workers.env.trajectory import Trajectory
from rlinf.workers.errors import WorkerDiedError
from rlinf.workers.flow import (
    ChannelSpec,
    ComponentSpec,
    FlowChannel,
    FlowRun,
    FlowWorker,
    MacroFlow,
    StepContext,
)
from rlinf.workers.flow.channels import ChannelTransport
from rlinf.workers.models import PolicyConfig

from ..leaks import eventually


def replay_mismatches(trajectory: Trajectory, env: EnvWorkerConfig) -> int:
    """Steps whose recorded observation is not what env j's own simulator, replayed alone
    from its seed with the recorded actions, shows: 0 when every transition reached the
    trainer once, in order, in its env's column (whatever the policy computed)."""
    from rlinf.envs.embodied import make_vector_env

    mismatches = 0
    for column, index in enumerate(trajectory.env_indices.tolist()):
        sim = make_vector_env(env.env_name, num_envs=1, seed=env.seed + index,
                              max_episode_steps=env.max_episode_steps)
        low, high = sim.single_action_space.low, sim.single_action_space.high
        obs = sim.reset()[0]
        for t in range(trajectory.rewards.shape[0]):
            mismatches += not np.array_equal(obs[0], trajectory.obs[t, column])
            result = sim.step(np.clip(trajectory.actions[t, column][None], low, high))
            obs = result.obs
            mismatches += float(result.reward[0]) != float(trajectory.rewards[t, column])
        sim.close()
    return mismatches


class TrajectoryCheck(FlowWorker):
    """A trainer that checks what it receives: its transitions, distinct envs, env order
    and `replay_mismatches`, as metrics."""

    def __init__(self, context: Any, *, env: EnvWorkerConfig, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self.env = env

    def check(self, ctx: StepContext, *, input_channel: FlowChannel) -> dict[str, float]:
        joined = receive_trajectory(self.channel(input_channel), step=ctx.step,
                                    env_ranks=ctx.ranks[input_channel.src],
                                    timeout=self.io_timeout)
        steps, envs = joined.rewards.shape
        return {"transitions": float(joined.rewards.size), "steps": float(steps),
                "envs": float(envs), "distinct_envs": float(len(set(joined.env_indices))),
                "env_order": float(np.array_equal(joined.env_indices, np.arange(envs))),
                "replay_mismatches": float(replay_mismatches(joined, self.env)),
                "episode_ends": float((joined.terminated | joined.truncated).sum())}


# Test modules are not importable in Ray's worker processes: ship this class by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

ENVS = 16
POLICY = PolicyRolloutConfig(policy=PolicyConfig(obs_shape=(4,), action_dim=1,
                                                 hidden_sizes=(16, 16)), seed=5, num_threads=1)


def declare(*, steps: int, stages: int, transport: ChannelTransport = "p2p") -> MacroFlow:
    env = EnvWorkerConfig("InvertedPendulum-v5", num_envs=ENVS, pipeline_stages=stages, seed=11,
                          max_episode_steps=40)
    common: dict[str, Any] = {"io_timeout": 120.0, "num_threads": 1}
    return MacroFlow(
        (ComponentSpec(Component("env", resource="cpu", batch=ENVS), EnvRole, entry="rollout",
                       init_kwargs={"config": env, **common}),
         ComponentSpec(Component("rollout", resource="cpu", batch=ENVS), PolicyRole,
                       entry="serve", init_kwargs={"config": POLICY, **common},
                       inline_with="env", inline_kwargs={"policy": POLICY}),
         ComponentSpec(Component("trainer", resource="cpu", batch=ENVS * steps), TrajectoryCheck,
                       entry="check", init_kwargs={"env": env, "io_timeout": 300.0},
                       one_process=True)),
        (ChannelSpec(Edge("env", "rollout"), transport=transport),
         ChannelSpec(Edge("rollout", "env", feedback=True), transport=transport),
         ChannelSpec(Edge("env", "trainer"))),
        loops=(Loop(("env", "rollout"), steps),), global_batch=ENVS, name="env-workers")


def plan_for(flow: MacroFlow, placement: str, *, devices: int, stages: int) -> ExecutionPlan:
    """The fixed plan with env and policy exchanging stage groups of ENVS / stages envs."""
    plan = flow.fixed_plan(placement, num_devices=devices)
    micro = ENVS // stages
    return replace(plan, micro_batch={**plan.micro_batch, "env": micro, "rollout": micro})


def run_once(flow: MacroFlow, placement: str, *, devices: int, stages: int
             ) -> dict[str, float]:
    plan = plan_for(flow, placement, devices=devices, stages=stages)
    with FlowRun.launch(flow, plan, timeout=300) as run:
        record = run.step(0)
    return dict(record.rank_metrics["trainer"][0])


@pytest.fixture
def clean(cluster: str) -> Iterator[None]:
    before = live_segments()
    yield
    assert eventually(lambda: not orphaned_segments(before)), orphaned_segments(before)


@pytest.fixture(scope="module")
def one_worker(cluster: str) -> dict[str, float]:
    """What the trainer receives from one env worker with its policy inline (no loop
    transport: the reference of every split)."""
    reference = run_once(declare(steps=60, stages=4), "env, rollout, trainer: 0", devices=1,
                         stages=4)
    assert reference["transitions"] == ENVS * 60 and reference["env_order"] == 1.0
    assert reference["replay_mismatches"] == 0 and reference["episode_ends"] > 0
    return reference


@pytest.mark.parametrize(("placement", "devices", "transport"), [
    ("env, rollout: 0-1, trainer: 0", 2, "p2p"),           # two env ranks, an inline policy each
    ("env: 0-3, rollout: 4, trainer: 4", 5, "p2p"),         # one policy batching four env ranks
    ("env: 0-3, rollout: 4-5, trainer: 4", 6, "channel"),   # two policies over shared channels
])
def test_env_workers_deliver_the_one_worker_trajectory(clean, one_worker, placement, devices,
                                                       transport):
    flow = declare(steps=60, stages=4, transport=transport)
    split = run_once(flow, placement, devices=devices, stages=4)
    # Batched inference may round a value in the last bit, so episodes need not end where
    # the reference's did; every transition is still its env's own, once, in order.
    assert {k: v for k, v in split.items() if k != "episode_ends"} == {
        k: v for k, v in one_worker.items() if k != "episode_ends"}


@pytest.mark.slow
def test_four_env_workers_lose_and_duplicate_no_transition_over_100k_steps(clean):
    """102,400 transitions from four env ranks through one batching policy, each replayed
    against its env's own simulator."""
    flow = declare(steps=6_400, stages=4)
    split = run_once(flow, "env: 0-3, rollout: 4, trainer: 4", devices=5, stages=4)
    assert split["transitions"] == split["steps"] * split["envs"] == 102_400
    assert split["distinct_envs"] == ENVS and split["env_order"] == 1.0
    assert split["replay_mismatches"] == 0 and split["episode_ends"] > 1000


@pytest.mark.slow
def test_a_killed_env_worker_fails_the_step_naming_its_rank(clean):
    flow = declare(steps=200_000, stages=4)  # far longer than the test: the kill lands in it
    plan = plan_for(flow, "env: 0-3, rollout: 4, trainer: 4", devices=5, stages=4)
    with FlowRun.launch(flow, plan, timeout=300) as run:
        pid = run.group_of("env").infos[2].pid
        threading.Timer(2.0, os.kill, (pid, signal.SIGKILL)).start()
        started = time.monotonic()
        with pytest.raises(WorkerDiedError) as caught:
            run.step(0)
    assert caught.value.role == "env" and caught.value.rank == 2
    assert time.monotonic() - started < 60.0  # Ray's death report, not the 120 s io timeout
