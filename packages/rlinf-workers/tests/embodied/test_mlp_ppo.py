"""`MlpPPOKernel` against autograd: the same statistics, parameters and Adam state after
many updates (within float32 rounding), on every branch of the loss; and the models and
optimizers it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from rlinf.workers.embodied import EmbodiedActorConfig, EmbodiedActorWorker
from rlinf.workers.embodied.mlp_ppo import STAT_NAMES, MlpPPOKernel, PPOCoefficients
from rlinf.workers.embodied.ppo_step import ppo_terms
from rlinf.workers.env import Trajectory
from rlinf.workers.errors import ConfigError
from rlinf.workers.models.policy import PolicyConfig, build_actor_critic

from .conftest import CONTEXT, make_policy
from .reference import run_collocated

CONFIG = PolicyConfig(obs_shape=(5,), action_dim=2, hidden_sizes=(16, 16))


def _batch(seed: int, size: int = 64, importance: bool = False) -> dict[str, np.ndarray]:
    gen = np.random.default_rng(seed)
    old_log_probs = 3 * gen.standard_normal(size) - 4  # far from the current: many clip
    old_log_probs[:4] = (-60.0, 60.0, -60.0, 60.0)  # beyond the log-ratio clamp
    arrays = {"obs": gen.standard_normal((size, 5)), "actions": gen.standard_normal((size, 2)),
              "old_log_probs": old_log_probs, "old_values": gen.standard_normal(size),
              "advantages": 2 * gen.standard_normal(size) + 0.5,
              "returns": gen.standard_normal(size)}
    if importance:  # a lagging behaviour policy's truncated weights
        arrays["importance"] = np.minimum(gen.lognormal(0.0, 0.5, size), 2.0)
    return {key: value.astype(np.float32) for key, value in arrays.items()}


def _autograd_step(model: nn.Module, optimizer: torch.optim.Optimizer,
                   mb: dict[str, np.ndarray], coef: PPOCoefficients) -> list[float]:
    """The actor's autograd update (EmbodiedActorWorker._update)."""
    t = {key: torch.from_numpy(value) for key, value in mb.items()}
    terms = ppo_terms(model.evaluate(t["obs"], t["actions"]),  # type: ignore[operator]
                      old_log_probs=t["old_log_probs"], old_values=t["old_values"],
                      advantages=t["advantages"], returns=t["returns"],
                      clip_ratio=coef.clip_ratio, value_clip=coef.value_clip,
                      value_coef=coef.value_coef, entropy_coef=coef.entropy_coef,
                      normalize_advantages=coef.normalize_advantages,
                      importance=t.get("importance"))
    optimizer.zero_grad(set_to_none=True)
    terms.loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), coef.max_grad_norm, foreach=True)
    optimizer.step()
    return [*(float(v) for v in terms.stats.values()), float(norm)]


def _pair(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, nn.Module,
                               torch.optim.Optimizer]:
    models = [build_actor_critic(CONFIG, seed=seed) for _ in range(2)]
    return (models[0], torch.optim.Adam(models[0].parameters(), lr=3e-3, eps=1e-5),
            models[1], torch.optim.Adam(models[1].parameters(), lr=3e-3, eps=1e-5, fused=True))


@pytest.mark.parametrize("value_clip", [None, 0.2])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize(("seed", "importance"), [(0, False), (1, False), (2, True)])
def test_many_updates_match_autograd(value_clip: float | None, normalize: bool,
                                     seed: int, importance: bool) -> None:
    coef = PPOCoefficients(clip_ratio=0.2, value_clip=value_clip, value_coef=0.5,
                           entropy_coef=0.01, normalize_advantages=normalize,
                           # small enough that most updates clip the gradient norm
                           max_grad_norm=1.0)
    reference, ref_opt, model, opt = _pair(seed)
    kernel = MlpPPOKernel(model, opt)
    clipped_norms = 0
    for update in range(40):
        mb = _batch(seed * 100 + update, importance=importance)
        want = _autograd_step(reference, ref_opt, mb, coef)
        got = kernel.step(coef, **mb)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5,
                                   err_msg=f"update {update}: {STAT_NAMES}")
        assert 0.0 < got[1] < 1.0  # both sides of the ratio clip were taken
        clipped_norms += got[5] > coef.max_grad_norm
    kernel.finish()
    assert clipped_norms > 10
    for (name, want_p), got_p in zip(reference.named_parameters(), model.parameters(),
                                     strict=True):
        torch.testing.assert_close(got_p, want_p, rtol=1e-4, atol=1e-5, msg=name)
    # The optimizer's state is the autograd path's too: a checkpoint is the same either way.
    for want_p, got_p in zip(reference.parameters(), model.parameters(), strict=True):
        want_s, got_s = ref_opt.state[want_p], opt.state[got_p]
        assert float(got_s["step"]) == float(want_s["step"]) == 40
        torch.testing.assert_close(got_s["exp_avg"], want_s["exp_avg"], rtol=1e-3, atol=1e-6)
        torch.testing.assert_close(got_s["exp_avg_sq"], want_s["exp_avg_sq"], rtol=1e-3,
                                   atol=1e-8)


def test_a_kernel_picks_up_where_autograd_left_off() -> None:
    coef = PPOCoefficients(clip_ratio=0.2, value_clip=None, value_coef=0.5, entropy_coef=0.0,
                           normalize_advantages=True, max_grad_norm=0.5)
    reference, ref_opt, model, opt = _pair(3)
    for update in range(5):  # both start on autograd: the optimizer's state exists
        _autograd_step(reference, ref_opt, _batch(update), coef)
        _autograd_step(model, opt, _batch(update), coef)
    kernel = MlpPPOKernel(model, opt)
    for update in range(5, 10):
        _autograd_step(reference, ref_opt, _batch(update), coef)
        kernel.step(coef, **_batch(update))
    kernel.finish()
    for want, got in zip(reference.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert float(opt.state[next(model.parameters())]["step"]) == 10


def test_supports_only_what_it_computes() -> None:
    model = build_actor_critic(CONFIG, seed=0)
    assert MlpPPOKernel.supports(model, torch.optim.Adam(model.parameters()))
    assert not MlpPPOKernel.supports(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert not MlpPPOKernel.supports(model, torch.optim.Adam(model.parameters(),
                                                             weight_decay=0.1))
    assert not MlpPPOKernel.supports(model, torch.optim.Adam(model.parameters(), amsgrad=True))
    discrete = build_actor_critic(PolicyConfig(obs_shape=(5,), action_dim=3, discrete=True),
                                  seed=0)
    assert not MlpPPOKernel.supports(discrete, torch.optim.Adam(discrete.parameters()))
    pixels = build_actor_critic(PolicyConfig(obs_shape=(3, 8, 8), action_dim=2), seed=0)
    assert not MlpPPOKernel.supports(pixels, torch.optim.Adam(pixels.parameters()))
    with pytest.raises(ConfigError, match="supports"):
        MlpPPOKernel(discrete, torch.optim.Adam(discrete.parameters()))


def _trajectory(make_env) -> Trajectory:
    env = make_env(seed=0, num_envs=4)
    return Trajectory.concat(run_collocated(env, make_policy(4, 1), num_steps=32).trajectories)


def test_the_actor_trains_alike_on_either_path_and_checkpoints_across_them(make_env,
                                                                          tmp_path) -> None:
    traj = _trajectory(make_env)
    policy = PolicyConfig(obs_shape=(4,), action_dim=1)

    def actor(fused: bool) -> EmbodiedActorWorker:
        return EmbodiedActorWorker(CONTEXT, config=EmbodiedActorConfig(
            policy=policy, num_threads=1, epochs=2, num_minibatches=4, fused_update=fused,
            seed=5))

    fused, plain = actor(True), actor(False)
    for _ in range(2):
        want, got = plain.train(traj), fused.train(traj)
        assert want.keys() == got.keys()
        for name in want:
            assert got[name] == pytest.approx(want[name], rel=1e-3, abs=1e-5), name
    for name, value in plain.get_weights().items():
        torch.testing.assert_close(fused.get_weights()[name], value, rtol=1e-4, atol=1e-6)
    # A fused run's checkpoint resumes on autograd, and the other way round.
    path = fused.save_checkpoint(tmp_path / "fused.pt")
    resumed = actor(False)
    resumed.load_checkpoint(path)
    fused.train(traj)
    resumed.train(traj)
    for name, value in fused.get_weights().items():
        torch.testing.assert_close(resumed.get_weights()[name], value, rtol=1e-4, atol=1e-6)
    assert resumed.optimizer.state_dict()["state"][0]["step"] == 24
