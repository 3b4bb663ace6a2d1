"""The embodied macro flow: placements agree, resume is exact, VLA trains, deaths surface.

The flows' workers are local processes, as a run's on one machine (``RLINF_TEST_RAY=1``: one
`ray.init(num_cpus=2)` for the module); flows are shared where a test does not spoil them
(each launch starts worker processes, seconds each on the shared 2-core machine).
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from rlinf_embodied.flow import (
    EmbodiedFlow,
    EmbodiedSpec,
    EmbodiedStepResult,
    embodied_workflow,
    fixed_plan,
)

from rlinf.workers.embodied.actor import EmbodiedActorConfig
from rlinf.workers.embodied.vla import VLAConfig
from rlinf.workers.env import EnvWorkerConfig
from rlinf.workers.errors import ConfigError, WorkerDiedError
from rlinf.workers.flow import FlowClosedError
from rlinf.workers.models.policy import PolicyConfig

# Wall-clock figures differ between runs; everything else must match exactly.
TIMING = {"env_steps_per_s", "rollout_steps_per_s", "rollout_seconds", "train_seconds",
          "sync_seconds", "env_step_seconds", "env_wait_seconds", "iteration_seconds"}

SPEC = EmbodiedSpec(
    env=EnvWorkerConfig("InvertedPendulum-v5", num_envs=4, pipeline_stages=2, seed=3,
                        max_episode_steps=30),
    policy=PolicyConfig(obs_shape=(4,), action_dim=1, hidden_sizes=(32, 32)),
    actor=EmbodiedActorConfig(epochs=2, num_minibatches=4),
    rollout_steps=12, seed=1, torch_threads=1, link_timeout=30.0)


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    import ray

    from rlinf.workers.runtime.ray_session import stop_ray

    if os.environ.get("RLINF_TEST_RAY") != "1":
        yield
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        stop_ray()  # ray.shutdown() without its second on the monitor


@pytest.fixture(scope="module")
def collocated() -> Iterator[EmbodiedFlow]:
    with EmbodiedFlow.launch(SPEC, fixed_plan(SPEC, "collocated"), trace=True) as flow:
        yield flow


@pytest.fixture(scope="module")
def hybrid() -> Iterator[EmbodiedFlow]:
    with EmbodiedFlow.launch(SPEC, fixed_plan(SPEC, "hybrid"), trace=True) as flow:
        yield flow


def outcome(result: EmbodiedStepResult) -> dict[str, float]:
    return {k: v for k, v in result.metrics.items() if k not in TIMING}


def run(flow: EmbodiedFlow, steps: range) -> list[dict[str, float]]:
    return [outcome(flow.step(s)) for s in steps]


def assert_same_weights(a: EmbodiedFlow, b: EmbodiedFlow) -> None:
    wa, wb = a.get_weights(), b.get_weights()
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=0, atol=0, msg=key)


def test_collocated_and_hybrid_train_identically(collocated, hybrid, tmp_path):
    assert collocated.inline and not hybrid.inline
    assert hybrid.stages == collocated.stages == 2
    # Both start from the same checkpoint, so the test does not depend on test order.
    collocated.save(tmp_path / "start")
    hybrid.load(tmp_path / "start")
    a = run(collocated, range(3))
    b = run(hybrid, range(3))
    assert a == b
    assert any("episode_return" in m for m in a)  # episodes ended (30-step limit)
    assert all(math.isfinite(m["policy_loss"]) and m["value_loss"] > 0 for m in a)
    assert_same_weights(collocated, hybrid)
    assert collocated.evaluate(num_episodes=2, seed=9) == hybrid.evaluate(num_episodes=2,
                                                                         seed=9)


def test_spans_one_track_per_worker(hybrid):
    result = hybrid.step(10)
    tracks = {s.track for s in result.spans}
    assert {"env/0", "rollout/0", "actor/0"} <= tracks
    assert [s.name for s in result.spans if s.track == "actor/0" and s.name == "train"] == [
        "train"]  # the update's span reaches the trace (not drained inside the actor)
    env_steps = [s for s in result.spans if s.track == "env/0" and s.name == "env_step"]
    infer = [s for s in result.spans if s.track == "rollout/0" and s.name == "infer"]
    assert len(env_steps) == SPEC.rollout_steps * 2  # one per stage group and step
    assert len(infer) == (SPEC.rollout_steps + 1) * 2  # plus the bootstrap batches
    assert all(s.end >= s.start for s in result.spans)
    assert result.env_steps == SPEC.rollout_steps * SPEC.env.num_envs


def test_save_load_continues_the_same_trajectory(hybrid, collocated, tmp_path):
    run(hybrid, range(20, 22))  # mid-episode state worth saving
    hybrid.save(tmp_path / "ckpt")
    uninterrupted = run(hybrid, range(22, 25))
    weights = hybrid.get_weights()
    hybrid.load(tmp_path / "ckpt")
    assert run(hybrid, range(22, 25)) == uninterrupted
    # Another placement resumes the same run too (same stage groups).
    collocated.load(tmp_path / "ckpt")
    assert run(collocated, range(22, 25)) == uninterrupted
    for key, value in collocated.get_weights().items():
        torch.testing.assert_close(value, weights[key], rtol=0, atol=0, msg=key)


def test_two_env_workers_train_like_one_and_resume_exactly(tmp_path):
    """env on two devices: two env workers of two envs each, each with its policy inline,
    simulate the envs one worker simulates (same seeds, same sampling streams) in stage
    groups of half the size, so training matches one worker's up to the rounding of policy
    batches of another size; a checkpoint of two workers resumes exactly, on two workers
    only."""
    with EmbodiedFlow.launch(SPEC, fixed_plan(SPEC, "collocated")) as single:
        alone = run(single, range(3))
        weights = single.get_weights()
    plan = fixed_plan(SPEC, "env,rollout: 0-1, actor: 0", num_devices=2)
    with EmbodiedFlow.launch(SPEC, plan) as split:
        assert split.inline and split.run.group_of("env").world_size == 2
        together = run(split, range(3))
        assert [m["episodes"] for m in together] == [m["episodes"] for m in alone]
        assert together == [pytest.approx(m, rel=1e-4, abs=1e-6) for m in alone]
        for key, value in split.get_weights().items():
            torch.testing.assert_close(value, weights[key], rtol=1e-4, atol=1e-5, msg=key)
        split.save(tmp_path / "two")
        uninterrupted = run(split, range(3, 5))
        split.load(tmp_path / "two")
        assert run(split, range(3, 5)) == uninterrupted
    with (EmbodiedFlow.launch(SPEC, fixed_plan(SPEC, "collocated")) as single,
          pytest.raises(ConfigError, match="2 env workers")):
        single.load(tmp_path / "two")


def test_a_policy_lag_runs_each_rollout_beside_the_previous_update(collocated, tmp_path):
    """algorithm.policy_lag=1 with the actor on a device of its own: step k's rollout acts
    with the weights before the update on k-1's rollout, which runs meanwhile and is
    corrected for the lag; `drain` trains the last rollout, so a checkpoint taken after it
    resumes exactly."""
    spec = dataclasses.replace(SPEC, actor=dataclasses.replace(SPEC.actor, policy_lag=1))
    collocated.save(tmp_path / "start")
    with EmbodiedFlow.launch(spec, fixed_plan(spec, "env,rollout: 0, actor: 1")) as lagged:
        lagged.load(tmp_path / "start")
        first = outcome(lagged.step(0))
        assert "policy_loss" not in first  # nothing to train on yet
        assert first == {k: v for k, v in run(collocated, range(1))[0].items()
                         if k not in ("policy_loss", "clip_fraction", "approx_kl",
                                      "value_loss", "entropy", "grad_norm")}
        second = outcome(lagged.step(1))
        # the rollout of iteration 0 was acted by the actor's own weights: no lag yet
        assert second["importance_weight"] == pytest.approx(1.0, abs=1e-4)
        third = outcome(lagged.step(2, drain=True))
        assert lagged.run.pending_step is None
        # the drained update trained rollout 2, acted by weights one update old
        assert third["importance_weight"] != 1.0 and third["behaviour_kl"] != 0.0
        lagged.save(tmp_path / "lagged")
        uninterrupted = [outcome(lagged.step(3)), outcome(lagged.step(4, drain=True))]
        weights = lagged.get_weights()
        lagged.load(tmp_path / "lagged")
        assert [outcome(lagged.step(3)), outcome(lagged.step(4, drain=True))] == uninterrupted
        for key, value in lagged.get_weights().items():
            torch.testing.assert_close(value, weights[key], rtol=0, atol=0, msg=key)


def test_load_rejects_what_is_not_a_checkpoint(collocated, tmp_path):
    with pytest.raises(ConfigError, match="not an embodied flow checkpoint"):
        collocated.load(tmp_path / "missing")


def test_spec_and_plan_errors_are_typed():
    with pytest.raises(ConfigError, match=r"env\.pixels"):
        EmbodiedSpec(env=SPEC.env, policy=VLAConfig(image_shape=(3, 16, 16), action_dim=1),
                     actor=SPEC.actor, rollout_steps=4)
    with pytest.raises(ConfigError, match="reset_every_iteration"):
        EmbodiedSpec(env=SPEC.env, policy=SPEC.policy, rollout_steps=4,
                     actor=EmbodiedActorConfig(algorithm="grpo"))
    with pytest.raises(ConfigError, match="names no devices"):
        fixed_plan(SPEC, "auto")
    workflow = embodied_workflow(SPEC)
    assert workflow.steps_of("env") == SPEC.rollout_steps
    assert workflow.batch_of("actor") == SPEC.samples_per_iteration


def test_wrong_policy_shape_fails_at_launch():
    bad = EmbodiedSpec(env=SPEC.env, policy=PolicyConfig(obs_shape=(5,), action_dim=1),
                       actor=SPEC.actor, rollout_steps=4)
    with pytest.raises(ConfigError, match="obs_shape"):
        EmbodiedFlow.launch(bad, fixed_plan(bad, "collocated"))


@pytest.mark.slow
def test_vla_ppo_step_on_pixels():
    spec = EmbodiedSpec(
        env=EnvWorkerConfig("InvertedPendulum-v5", num_envs=2, seed=0, pixels=(16, 16),
                            max_episode_steps=20, instruction="balance the pole"),
        policy=VLAConfig(image_shape=(3, 16, 16), action_dim=1, num_bins=8, hidden_size=32,
                         num_heads=2, max_instruction_tokens=16),
        actor=EmbodiedActorConfig(epochs=1, num_minibatches=2, lr=1e-3),
        rollout_steps=4, torch_threads=1, link_timeout=60.0)
    with EmbodiedFlow.launch(spec, fixed_plan(spec, "collocated")) as flow:
        before = flow.get_weights()
        result = flow.step(0)
        after = flow.get_weights()
        assert result.env_steps == 8
        for key in ("policy_loss", "value_loss", "entropy", "grad_norm"):
            assert math.isfinite(result.metrics[key]), key
        assert any(not torch.equal(before[k], after[k]) for k in before)
        evaluation = flow.evaluate(num_episodes=1, seed=4, record_video=True, max_steps=20)
        assert evaluation.frames is not None and evaluation.frames.dtype == np.uint8
        assert evaluation.frames.shape[1:] == (16, 16, 3)


@pytest.mark.slow
def test_killed_env_rank_raises_worker_died_naming_it():
    # A rollout far longer than the test: the kill always lands while it runs.
    spec = EmbodiedSpec(env=SPEC.env, policy=SPEC.policy, actor=SPEC.actor,
                        rollout_steps=200_000, seed=1, torch_threads=1, link_timeout=60.0)
    flow = EmbodiedFlow.launch(spec, fixed_plan(spec, "hybrid"))
    try:
        pid = flow.run.group_of("env").infos[0].pid
        killed: list[float] = []

        def kill() -> None:
            os.kill(pid, signal.SIGKILL)
            killed.append(time.monotonic())

        threading.Timer(1.0, kill).start()
        with pytest.raises(WorkerDiedError) as caught:
            flow.step(0)
        assert caught.value.role == "env" and caught.value.rank == 0
        assert "env" in str(caught.value)
        # Raised when Ray reports the death, not after the policy's 60 s link timeout.
        assert time.monotonic() - killed[0] < 30.0
    finally:
        flow.close()
    flow.close()  # idempotent
    with pytest.raises(FlowClosedError, match="closed"):
        flow.step(1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a GPU-less cluster")
def test_cuda_device_on_a_cluster_without_gpus_says_what_to_do() -> None:
    spec = EmbodiedSpec(env=SPEC.env, policy=SPEC.policy, actor=SPEC.actor,
                        rollout_steps=SPEC.rollout_steps, device="cuda")
    with pytest.raises(ConfigError, match="has 0 GPUs"):
        EmbodiedFlow.launch(spec, fixed_plan(spec, "hybrid"))
