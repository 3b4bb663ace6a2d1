"""GAE, discounted returns and GRPO advantages against hand-computed values, plus properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinf.workers.algorithms import (
    bootstrap_next_values,
    broadcast_to_tokens,
    discounted_returns,
    gae,
    grpo_advantages,
    place_at_last_token,
)
from rlinf.workers.errors import ConfigError, ShapeError

T = torch.tensor
REWARDS = T([1.0, 2.0, 3.0])
VALUES = T([0.5, 1.0, 1.5])
LAST_VALUE = T(2.0)


def test_gae_no_dones() -> None:
    # gamma = lam = 0.5, next_values = [1.0, 1.5, 2.0]
    # deltas: 1 + .5*1 - .5 = 1.0 ; 2 + .5*1.5 - 1 = 1.75 ; 3 + .5*2 - 1.5 = 2.5
    # A2 = 2.5 ; A1 = 1.75 + .25*2.5 = 2.375 ; A0 = 1.0 + .25*2.375 = 1.59375
    nv = bootstrap_next_values(VALUES, LAST_VALUE)
    assert torch.equal(nv, T([1.0, 1.5, 2.0]))
    adv, ret = gae(REWARDS, VALUES, next_values=nv, gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv, T([1.59375, 2.375, 2.5]))
    torch.testing.assert_close(ret, T([2.09375, 3.375, 4.0]))


def test_gae_termination_cuts_bootstrap_and_trace() -> None:
    # terminated after step 1: delta1 = 2 + 0 - 1 = 1.0 ; A1 = 1.0 (no trace from A2)
    # A2 = 2.5 ; A0 = 1.0 + .25*1.0 = 1.25
    nv = bootstrap_next_values(VALUES, LAST_VALUE)
    adv, _ = gae(REWARDS, VALUES, next_values=nv, gamma=0.5, lam=0.5,
                 terminated=T([False, True, False]))
    torch.testing.assert_close(adv, T([1.25, 1.0, 2.5]))


def test_gae_truncation_bootstraps_from_final_observation() -> None:
    # truncated after step 1 with V(final obs) = 4.0: delta1 = 2 + .5*4 - 1 = 3.0 ;
    # A1 = 3.0 (trace cut) ; A0 = 1.0 + .25*3.0 = 1.75 ; A2 = 2.5
    nv = T([1.0, 4.0, 2.0])
    adv, _ = gae(REWARDS, VALUES, next_values=nv, gamma=0.5, lam=0.5,
                 truncated=T([0.0, 1.0, 0.0]))
    torch.testing.assert_close(adv, T([1.75, 3.0, 2.5]))


def test_gae_batched_leading_dims() -> None:
    rewards = torch.stack([REWARDS, REWARDS * 0])
    values = torch.stack([VALUES, VALUES])
    nv = bootstrap_next_values(values, T([2.0, 2.0]))
    adv, _ = gae(rewards, values, next_values=nv, gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv[0], T([1.59375, 2.375, 2.5]))
    # row 1: deltas = [.5*1 - .5, .5*1.5 - 1, .5*2 - 1.5] = [0, -.25, -.5]
    # A2 = -.5 ; A1 = -.25 - .125 = -.375 ; A0 = 0 - .09375
    torch.testing.assert_close(adv[1], T([-0.09375, -0.375, -0.5]))


def test_discounted_returns_hand_computed() -> None:
    # no bootstrap: G2 = 3 ; G1 = 2 + .5*3 = 3.5 ; G0 = 1 + .5*3.5 = 2.75
    torch.testing.assert_close(discounted_returns(REWARDS, gamma=0.5), T([2.75, 3.5, 3.0]))
    # terminated after step 0: G0 = 1 (nothing follows)
    torch.testing.assert_close(
        discounted_returns(REWARDS, gamma=0.5, terminated=T([True, False, False])),
        T([1.0, 3.5, 3.0]))
    # truncated after step 1 with V(final obs) = 4, last-step bootstrap V = 2:
    # G2 = 3 + .5*2 = 4 ; G1 = 2 + .5*4 = 4 ; G0 = 1 + .5*4 = 3
    torch.testing.assert_close(
        discounted_returns(REWARDS, gamma=0.5, truncated=T([False, True, False]),
                           next_values=T([9.0, 4.0, 2.0])),
        T([3.0, 4.0, 4.0]))


def test_grpo_hand_computed() -> None:
    # group [1, 0, 0]: mean 1/3, deviations (2/3, -1/3, -1/3), unbiased var = (6/9)/2 = 1/3,
    # std = 0.57735 -> (1.1547, -0.57735, -0.57735); group [1, 1, 1]: std 0 -> 0 / eps = 0
    adv = grpo_advantages(T([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]), group_size=3)
    s = 1 / math.sqrt(3)
    torch.testing.assert_close(adv, T([(2 / 3) / s, -(1 / 3) / s, -(1 / 3) / s, 0, 0, 0]),
                               atol=1e-5, rtol=1e-5)
    # group [3, 1]: mean 2, unbiased std sqrt(2) -> +-0.70711
    torch.testing.assert_close(grpo_advantages(T([3.0, 1.0]), group_size=2, eps=0.0),
                               T([1 / math.sqrt(2), -1 / math.sqrt(2)]))
    # Dr. GRPO: only the mean is removed
    torch.testing.assert_close(
        grpo_advantages(T([1.0, 0.0, 0.0]), group_size=3, normalize_std=False),
        T([2 / 3, -1 / 3, -1 / 3]))
    # a group of one has no baseline: the raw reward over 1 + eps, as veRL (not 0, not NaN)
    torch.testing.assert_close(grpo_advantages(T([5.0, 2.0]), group_size=1),
                               T([5.0, 2.0]) / (1 + 1e-6))
    assert torch.equal(grpo_advantages(T([5.0, 2.0]), group_size=1, normalize_std=False),
                       T([5.0, 2.0]))


def test_grpo_rejects_bad_groups() -> None:
    with pytest.raises(ConfigError, match="divide"):
        grpo_advantages(T([1.0, 2.0, 3.0]), group_size=2)
    with pytest.raises(ShapeError):
        grpo_advantages(T([[1.0, 2.0]]), group_size=2)


def test_token_broadcast_and_last_token() -> None:
    mask = T([[1, 1, 0], [0, 1, 1], [0, 0, 0]])
    seq = T([5.0, 7.0, 9.0])
    assert torch.equal(broadcast_to_tokens(seq, mask), T([[5.0, 5, 0], [0, 7, 7], [0, 0, 0]]))
    assert torch.equal(place_at_last_token(seq, mask), T([[0.0, 5, 0], [0, 0, 7], [0, 0, 0]]))
    with pytest.raises(ShapeError):
        broadcast_to_tokens(T([1.0]), mask)


def test_shape_and_range_errors() -> None:
    with pytest.raises(ShapeError, match="values="):
        gae(REWARDS, VALUES[:2], next_values=VALUES, gamma=0.9, lam=0.9)
    with pytest.raises(ConfigError, match="gamma"):
        discounted_returns(REWARDS, gamma=1.5)
    with pytest.raises(ShapeError, match="last_value"):
        bootstrap_next_values(VALUES, T([1.0, 2.0]))


@st.composite
def _episodes(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    n = draw(st.integers(1, 3))
    steps = draw(st.integers(1, 8))
    floats = st.floats(-5, 5, allow_nan=False, width=32)
    shape = (n, steps)

    def tensor() -> torch.Tensor:
        return T(draw(st.lists(floats, min_size=n * steps, max_size=n * steps))).reshape(shape)

    rewards, values, finals = tensor(), tensor(), tensor()
    flags = T(draw(st.lists(st.integers(0, 2), min_size=n * steps, max_size=n * steps)))
    terminated, truncated = (flags == 1).reshape(shape), (flags == 2).reshape(shape)
    last = T(draw(st.lists(floats, min_size=n, max_size=n)))
    # next values are the following step's value, except after a truncation (final obs)
    nv = torch.where(truncated, finals, bootstrap_next_values(values, last))
    return rewards, values, nv, terminated, truncated


@settings(max_examples=60, deadline=None)
@given(_episodes(), st.floats(0.0, 1.0))
def test_gae_lambda_one_is_returns_minus_values(
    episode: tuple[torch.Tensor, ...], gamma: float
) -> None:
    rewards, values, nv, terminated, truncated = episode
    adv, ret = gae(rewards, values, next_values=nv, gamma=gamma, lam=1.0,
                   terminated=terminated, truncated=truncated)
    expected = discounted_returns(rewards, gamma=gamma, terminated=terminated,
                                  truncated=truncated, next_values=nv)
    torch.testing.assert_close(ret, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(adv, expected - values, atol=1e-4, rtol=1e-4)


@settings(max_examples=40, deadline=None)
@given(_episodes(), st.floats(0.0, 1.0))
def test_gae_lambda_zero_is_one_step_td(episode: tuple[torch.Tensor, ...], gamma: float) -> None:
    rewards, values, nv, terminated, truncated = episode
    adv, _ = gae(rewards, values, next_values=nv, gamma=gamma, lam=0.0,
                 terminated=terminated, truncated=truncated)
    td = rewards + gamma * (~terminated).float() * nv - values
    torch.testing.assert_close(adv, td, atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=4, max_size=24), st.sampled_from([2, 4]))
def test_grpo_groups_are_centred(values: list[int], group_size: int) -> None:
    usable = len(values) - len(values) % group_size
    rewards = T(values[:usable], dtype=torch.float64)
    adv = grpo_advantages(rewards, group_size=group_size).reshape(-1, group_size)
    torch.testing.assert_close(adv.mean(dim=1), torch.zeros(adv.shape[0], dtype=torch.float64))
