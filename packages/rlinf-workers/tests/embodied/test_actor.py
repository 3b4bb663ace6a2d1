import dataclasses

import numpy as np
import pytest
import torch

from rlinf.workers.embodied import EmbodiedActorConfig, EmbodiedActorWorker
from rlinf.workers.embodied.actor import first_episode_mask
from rlinf.workers.env import Trajectory
from rlinf.workers.errors import ConfigError, ShapeError
from rlinf.workers.models import PolicyConfig

from .conftest import CONTEXT, make_policy
from .reference import run_collocated

POLICY = PolicyConfig(obs_shape=(4,), action_dim=1)


def _actor(**options) -> EmbodiedActorWorker:
    options.setdefault("num_minibatches", 4)
    options.setdefault("epochs", 2)
    return EmbodiedActorWorker(CONTEXT, config=EmbodiedActorConfig(
        policy=POLICY, num_threads=1, **options))


def _trajectory(make_env, *, steps=32, seed=0, **env_options) -> Trajectory:
    env = make_env(seed=seed, **env_options)
    return Trajectory.concat(run_collocated(env, make_policy(4, 1), num_steps=steps).trajectories)


def test_first_episode_mask_stops_after_the_first_end():
    term = torch.tensor([[False, False], [True, False], [False, False], [True, False]])
    trunc = torch.tensor([[False, False], [False, False], [False, True], [False, False]])
    mask = first_episode_mask(term, trunc)
    torch.testing.assert_close(mask, torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0],
                                                   [0.0, 0.0]]))


def test_ppo_update_changes_weights_and_reports_stats(make_env):
    traj = _trajectory(make_env, num_envs=4)
    actor = _actor()
    before = actor.get_weights()
    stats = actor.train(traj)
    assert {"policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm"} <= set(stats)
    assert all(np.isfinite(v) for v in stats.values())
    assert any(not torch.equal(before[k], v) for k, v in actor.get_weights().items())
    assert actor.step == 1


def test_checkpoint_resume_reproduces_training(make_env, tmp_path):
    traj = _trajectory(make_env, num_envs=4)
    actor = _actor(seed=3)
    actor.train(traj)
    path = actor.save_checkpoint(tmp_path / "ckpt" / "actor.pt")
    actor.train(traj)
    expected = actor.get_weights()
    resumed = _actor(seed=99)  # different init and shuffling: everything must come from disk
    resumed.load_checkpoint(path)
    assert resumed.step == 1
    resumed.train(traj)
    for key, value in expected.items():
        assert torch.equal(resumed.get_weights()[key], value), key


def test_grpo_trains_on_same_start_blocks(make_env):
    traj = _trajectory(make_env, num_envs=8, same_start_group_size=4, steps=40)
    actor = _actor(algorithm="grpo", grpo_group_size=4)
    targets = actor._targets(traj)
    adv = targets["advantages"]
    # one advantage per episode, summing to zero within each block of 4 envs
    per_env = (adv * targets["mask"]).max(dim=0).values + (adv * targets["mask"]).min(dim=0).values
    assert per_env.shape == (8,)
    first = adv[0].reshape(2, 4)
    torch.testing.assert_close(first.sum(dim=1), torch.zeros(2), atol=1e-4, rtol=0)
    stats = actor.train(traj)
    assert "value_loss" not in stats and np.isfinite(stats["policy_loss"])


def test_grpo_needs_the_whole_worker_in_env_order(make_env):
    env = make_env(num_envs=8, pipeline_stages=2, same_start_group_size=4)
    part = run_collocated(env, make_policy(4, 1), num_steps=4).trajectories[1]
    with pytest.raises(ShapeError):
        _actor(algorithm="grpo").train(part)


@pytest.mark.parametrize("options", [{"algorithm": "a2c"}, {"epochs": 0}, {"lr": 0.0},
                                     {"device": "gpu"}, {"device": "cuda:x"},
                                     {"clip_ratio": -0.1}, {"value_clip": -1.0},
                                     {"policy_lag": -1}, {"max_importance_weight": 0.0}])
def test_config_rejects_bad_values(options):
    with pytest.raises(ConfigError):
        EmbodiedActorConfig(policy=POLICY, **options)


def test_too_many_minibatches_is_a_config_error(make_env):
    traj = _trajectory(make_env, num_envs=1, steps=2)
    with pytest.raises(ConfigError, match="num_minibatches"):
        _actor(num_minibatches=8).train(traj)


def test_offload_and_onload_keep_the_training_state(make_env):
    traj = _trajectory(make_env, num_envs=4)
    moved, kept = _actor(seed=5), _actor(seed=5)
    moved.train(traj)
    kept.train(traj)
    moved.offload()
    assert all(p.device.type == "cpu" for p in moved.model.parameters())
    moved.onload()
    moved.train(traj)
    kept.train(traj)
    for key, value in kept.get_weights().items():
        assert torch.equal(moved.get_weights()[key], value), key


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_cuda_actor_without_a_gpu_says_what_to_do():
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        _actor(device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_actor_trains_like_the_cpu_actor_and_checkpoints_across_devices(make_env, tmp_path):
    traj = _trajectory(make_env, num_envs=4)
    cpu, gpu = _actor(seed=7), _actor(seed=7, device="cuda")
    assert all(p.device.type == "cuda" for p in gpu.model.parameters())
    cpu_stats, gpu_stats = cpu.train(traj), gpu.train(traj)
    for key in ("policy_loss", "value_loss", "entropy"):
        assert gpu_stats[key] == pytest.approx(cpu_stats[key], rel=1e-3, abs=1e-5), key
    for key, value in cpu.get_weights().items():  # get_weights hands out CPU copies
        torch.testing.assert_close(gpu.get_weights()[key], value, rtol=1e-4, atol=1e-5)
    gpu.offload()
    assert all(p.device.type == "cpu" for p in gpu.model.parameters())
    assert all(v.device.type == "cpu" for state in gpu.optimizer.state.values()
               for v in state.values() if isinstance(v, torch.Tensor))
    gpu.onload()
    path = gpu.save_checkpoint(tmp_path / "gpu.pt")
    on_cpu = _actor(seed=1)
    on_cpu.load_checkpoint(path)  # written on the GPU, resumed on the CPU
    gpu.train(traj)
    on_cpu.train(traj)
    for key, value in on_cpu.get_weights().items():
        torch.testing.assert_close(gpu.get_weights()[key], value, rtol=1e-3, atol=1e-4)


def test_small_updates_run_on_one_thread_and_big_ones_on_the_whole_budget(make_env):
    before = torch.get_num_threads()
    small = _actor()  # 64x64 MLP on 4 inputs: ~10k parameters
    assert small._update_threads(64, budget=2) == 1
    assert small._update_threads(64, budget=1) == 1
    big = EmbodiedActorWorker(CONTEXT, config=EmbodiedActorConfig(
        policy=PolicyConfig(obs_shape=(17,), action_dim=6, hidden_sizes=(768, 768)),
        num_threads=2))
    assert big._update_threads(64, budget=2) == 2
    assert big._update_threads(64, budget=4) == 4
    # Training restores the thread budget it was given.
    trajectory = _trajectory(make_env, num_envs=4)
    torch.set_num_threads(2)
    try:
        small.train(trajectory)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _own(actor: EmbodiedActorWorker, traj: Trajectory) -> Trajectory:
    """`traj` as if `actor`'s current policy had acted: its own log-probs of the actions."""
    with torch.no_grad():
        ev = actor.model.evaluate(torch.from_numpy(traj.obs).flatten(0, 1),
                                  torch.from_numpy(traj.actions).flatten(0, 1))
    return dataclasses.replace(traj, log_probs=ev.log_prob.reshape(traj.log_probs.shape).numpy())


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_a_lag_correction_without_a_lag_changes_nothing(make_env, fused, algorithm):
    """The behaviour policy is the actor's: π_prox = π_behaviour, every weight is 1 and the
    update is the uncorrected one, bit for bit."""
    options = {"fused_update": fused, "algorithm": algorithm, "grpo_group_size": 4, "seed": 2}
    lagged, plain = _actor(policy_lag=1, **options), _actor(**options)
    traj = _own(plain, _trajectory(make_env, num_envs=8, same_start_group_size=4))
    stats, want = lagged.train(traj), plain.train(traj)
    assert stats["importance_weight"] == 1.0 and stats["behaviour_kl"] == 0.0
    assert stats["importance_truncated"] == 0.0
    assert {k: stats[k] for k in want} == want
    for name, value in plain.get_weights().items():
        assert torch.equal(lagged.get_weights()[name], value), name


def test_a_lagging_behaviour_policy_is_weighed_by_the_truncated_ratio(make_env):
    """One update behind: the ratio is clipped around the actor's policy before the update,
    and each sample weighs π_prox / π_behaviour, truncated at max_importance_weight."""
    actor = _actor(policy_lag=1, max_importance_weight=1.5, lr=3e-2)
    first = _trajectory(make_env, num_envs=4)
    stale = _own(actor, _trajectory(make_env, num_envs=4, seed=1))  # acted by θ0
    actor.train(_own(actor, first))  # θ0 → θ1: the policy that acted is one update old
    behaviour = torch.from_numpy(stale.log_probs).flatten()
    with torch.no_grad():
        prox = actor.model.evaluate(torch.from_numpy(stale.obs).flatten(0, 1),
                                    torch.from_numpy(stale.actions).flatten(0, 1)).log_prob
    flat = {"obs": torch.from_numpy(stale.obs).flatten(0, 1),
            "actions": torch.from_numpy(stale.actions).flatten(0, 1),
            "log_probs": behaviour.clone()}
    stats = actor._correct_for_lag(flat)
    ratio = torch.exp(prox - behaviour)
    torch.testing.assert_close(flat["log_probs"], prox)
    torch.testing.assert_close(flat["importance"], ratio.clamp(max=1.5))
    assert 0.0 < stats["importance_truncated"] < 1.0  # both sides of the truncation
    assert stats["behaviour_kl"] == pytest.approx(float((behaviour - prox).mean()), rel=1e-5)
    assert np.isfinite(actor.train(stale)["policy_loss"])


def test_the_numpy_update_kernel_runs_under_the_update_thread_budget(make_env, monkeypatch):
    # NumPy's BLAS pool defaults to one thread per core; a "one-thread" update used both
    # cores and ran 3-6x slower beside a busy env worker (runtime.threads).
    from threadpoolctl import threadpool_info

    from rlinf.workers.embodied.mlp_ppo import MlpPPOKernel
    from rlinf.workers.runtime.threads import set_cpu_threads

    seen: list[set[int]] = []
    step = MlpPPOKernel.step

    def recording_step(self, *args, **kwargs):
        seen.append({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})
        return step(self, *args, **kwargs)

    monkeypatch.setattr(MlpPPOKernel, "step", recording_step)
    before = torch.get_num_threads()
    actor = _actor()  # 64x64: small enough for one thread (`_update_threads`)
    trajectory = _trajectory(make_env, num_envs=4)
    set_cpu_threads(2)
    try:
        actor.train(trajectory)
        assert seen and all(threads == {1} for threads in seen)
        after = {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}
        assert torch.get_num_threads() == 2 and after == {2}
    finally:
        set_cpu_threads(before)
