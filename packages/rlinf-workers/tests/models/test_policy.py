"""Embodied actor-critic: shapes, log-prob/entropy vs torch.distributions, determinism."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Categorical, Normal

from rlinf.workers.errors import ConfigError, ShapeError
from rlinf.workers.models import PolicyConfig, build_actor_critic


def test_continuous_state_policy_matches_normal() -> None:
    policy = build_actor_critic(PolicyConfig(obs_shape=(5,), action_dim=3, init_log_std=-0.5),
                                seed=0)
    obs = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    sample = policy.act(obs, generator=torch.Generator().manual_seed(2))
    assert sample.action.shape == (4, 3)
    assert sample.log_prob.shape == sample.value.shape == (4,)
    dist = Normal(policy.policy_params(obs), torch.full((3,), -0.5).exp())
    ev = policy.evaluate(obs, sample.action)
    torch.testing.assert_close(ev.log_prob, dist.log_prob(sample.action).sum(-1))
    torch.testing.assert_close(ev.entropy, dist.entropy().sum(-1))
    torch.testing.assert_close(sample.log_prob, ev.log_prob)
    assert torch.equal(policy.act(obs, deterministic=True).action, policy.policy_params(obs))


def test_discrete_pixel_policy_matches_categorical() -> None:
    config = PolicyConfig(obs_shape=(3, 16, 16), action_dim=4, discrete=True)
    policy = build_actor_critic(config, seed=0)
    obs = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(0))
    sample = policy.act(obs, generator=torch.Generator().manual_seed(3))
    assert sample.action.shape == (2,)
    assert sample.action.dtype == torch.int64
    dist = Categorical(logits=policy.policy_params(obs))
    ev = policy.evaluate(obs, sample.action)
    torch.testing.assert_close(ev.log_prob, dist.log_prob(sample.action))
    torch.testing.assert_close(ev.entropy, dist.entropy())
    # the policy head starts near uniform (gain 0.01): entropy close to ln 4
    assert torch.allclose(ev.entropy, torch.full((2,), torch.log(torch.tensor(4.0)).item()),
                          atol=1e-2)


def test_deterministic_under_seed() -> None:
    config = PolicyConfig(obs_shape=(5,), action_dim=2)
    a, b = build_actor_critic(config, seed=3), build_actor_critic(config, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values(), strict=True))
    obs = torch.ones(2, 5)
    first = a.act(obs, generator=torch.Generator().manual_seed(9)).action
    again = b.act(obs, generator=torch.Generator().manual_seed(9)).action
    assert torch.equal(first, again)


def test_validation() -> None:
    with pytest.raises(ConfigError, match="obs_shape"):
        PolicyConfig(obs_shape=(3, 4), action_dim=1)
    policy = build_actor_critic(PolicyConfig(obs_shape=(5,), action_dim=1), seed=0)
    with pytest.raises(ShapeError, match=r"\[N, \*\(5,\)\]"):
        policy.value(torch.zeros(2, 4))
