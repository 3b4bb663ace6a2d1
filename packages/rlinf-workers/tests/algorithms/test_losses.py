"""Policy/value losses, KL estimators, aggregation and masked statistics vs hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinf.workers.algorithms import (
    KLEstimator,
    LossAggregation,
    aggregate_loss,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    masked_var,
    masked_whiten,
    ppo_policy_loss,
    value_loss,
)
from rlinf.workers.errors import ConfigError, ShapeError

T = torch.tensor
LN = math.log


def test_ppo_clipping_hand_computed() -> None:
    # token 0: A = +1, ratio 1.3 -> max(-1.3, -1.2) = -1.2 (clipped)
    # token 1: A = -1, ratio 0.5 -> max(0.5, 0.8) = 0.8 (clipped)
    # token 2: A = +2, ratio 1.1 -> max(-2.2, -2.2) = -2.2 (inside the trust region)
    # token 3: padding. token-mean = (-1.2 + 0.8 - 2.2) / 3 = -0.8666...
    lp = T([[LN(0.65), LN(0.25), LN(0.55), LN(0.9)]])
    old = T([[LN(0.5), LN(0.5), LN(0.5), LN(0.1)]])
    adv = T([[1.0, -1.0, 2.0, 5.0]])
    mask = T([[1, 1, 1, 0]])
    out = ppo_policy_loss(lp, old, adv, mask, clip_ratio=0.2)
    torch.testing.assert_close(out.loss, T(-2.6 / 3))
    torch.testing.assert_close(out.clip_fraction, T(2 / 3))
    assert out.dual_clip_fraction.item() == 0.0
    # approx_kl = mean(old - new) = (ln(.5/.65) + ln(2) + ln(.5/.55)) / 3
    torch.testing.assert_close(out.approx_kl, T((LN(0.5 / 0.65) + LN(2) + LN(0.5 / 0.55)) / 3))


def test_ppo_clip_higher_and_dual_clip() -> None:
    # clip-higher 0.28: A = 1, ratio 1.3 -> max(-1.3, -1.28) = -1.28
    out = ppo_policy_loss(T([[LN(1.3)]]), T([[0.0]]), T([[1.0]]), T([[1]]),
                          clip_ratio=0.2, clip_ratio_high=0.28)
    torch.testing.assert_close(out.loss, T(-1.28))
    # A = -1, ratio 4: max(4.0, 0.8) = 4.0; dual clip c = 3 bounds it by -c*A = 3.0
    args = (T([[LN(4.0)]]), T([[0.0]]), T([[-1.0]]), T([[1]]))
    torch.testing.assert_close(ppo_policy_loss(*args).loss, T(4.0))
    dual = ppo_policy_loss(*args, dual_clip=3.0)
    torch.testing.assert_close(dual.loss, T(3.0))
    assert dual.dual_clip_fraction.item() == 1.0
    with pytest.raises(ConfigError, match="dual_clip"):
        ppo_policy_loss(*args, dual_clip=0.5)


def test_dual_clip_bounds_negative_advantages_only() -> None:
    # eps 0.2, c 3. token 0: A = +1, ratio 4 -> max(-4, -1.2) = -1.2; positive: no dual clip
    # token 1: A = -1, ratio 4 -> max(4, 0.8) = 4 -> min(4, 3) = 3 (dual-clipped)
    # token 2: A = -1, ratio 2 -> max(2, 1.2) = 2 < 3 (kept)
    # token 3: A = -2, ratio 0.5 -> max(1, 1.6) = 1.6 < 6 (ratio-clipped, kept)
    # token-mean = (-1.2 + 3 + 2 + 1.6) / 4 = 1.35
    lp = T([[LN(4.0), LN(4.0), LN(2.0), LN(0.5)]], requires_grad=True)
    adv = T([[1.0, -1.0, -1.0, -2.0]])
    out = ppo_policy_loss(lp, torch.zeros(1, 4), adv, T([[1, 1, 1, 1]]), clip_ratio=0.2,
                          dual_clip=3.0)
    torch.testing.assert_close(out.loss, T(1.35))
    torch.testing.assert_close(out.dual_clip_fraction, T(0.25))
    torch.testing.assert_close(out.clip_fraction, T(0.5))  # tokens 0 and 3
    out.loss.backward()
    assert lp.grad is not None
    # d/dlp of -A r / 4 = -A r / 4 where unclipped (token 2: 1 * 2 / 4); constants elsewhere
    torch.testing.assert_close(lp.grad, T([[0.0, 0.0, 0.5, 0.0]]))


def test_ppo_on_policy_gradient() -> None:
    # ratio 1 everywhere: loss = -mean(A); d loss / d logp_i = -A_i / N for valid tokens
    lp = torch.zeros(1, 3, requires_grad=True)
    adv = T([[1.0, -2.0, 3.0]])
    out = ppo_policy_loss(lp, torch.zeros(1, 3), adv, T([[1, 1, 0]]))
    torch.testing.assert_close(out.loss, T(0.5))
    out.loss.backward()
    assert lp.grad is not None
    torch.testing.assert_close(lp.grad, T([[-0.5, 1.0, 0.0]]))


def test_value_loss_hand_computed() -> None:
    # tok0: v=2, old=1, R=1.5: err .25 ; clipped v = 1.2 -> .09 ; max .25
    # tok1: v=0, old=.5, R=1: err 1 ; clipped v = .3 -> .49 ; max 1
    # tok2: v=1, old=0, R=2: err 1 ; clipped v = .2 -> 3.24 ; max 3.24 (clipped wins)
    v, old, ret = T([[2.0, 0.0, 1.0]]), T([[1.0, 0.5, 0.0]]), T([[1.5, 1.0, 2.0]])
    mask = T([[1, 1, 1]])
    clipped = value_loss(v, old, ret, mask, clip_range=0.2)
    torch.testing.assert_close(clipped.loss, T(0.5 * (0.25 + 1 + 3.24) / 3))
    torch.testing.assert_close(clipped.clip_fraction, T(1 / 3))
    torch.testing.assert_close(value_loss(v, old, ret, mask).loss, T(0.5 * (0.25 + 1 + 1) / 3))


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [
        # log_ratio = ln(.5) - ln(.25) = ln 2
        ("k1", LN(2)),
        ("k2", 0.5 * LN(2) ** 2),
        (KLEstimator.K3, 0.5 - 1 + LN(2)),  # exp(-ln 2) - 1 + ln 2
        ("low-var-kl", 0.5 - 1 + LN(2)),
    ],
)
def test_kl_estimators(estimator: KLEstimator | str, expected: float) -> None:
    got = kl_penalty(T([LN(0.5)]), T([LN(0.25)]), estimator=estimator)
    torch.testing.assert_close(got, T([expected]))


def test_low_var_kl_is_clamped_and_unknown_rejected() -> None:
    # log_ratio = -20: k3 = e^20 - 1 - 20 ~ 4.85e8, the low-var form (= veRL's k3) clamps it
    assert kl_penalty(T([-20.0]), T([0.0]), estimator="k3-unclamped").item() > 1e8
    assert kl_penalty(T([-20.0]), T([0.0]), estimator="k3").item() == 10.0
    assert kl_penalty(T([-20.0]), T([0.0]), estimator="low-var-kl").item() == 10.0
    with pytest.raises(ConfigError, match="k3"):
        kl_penalty(T([0.0]), T([0.0]), estimator="k9")


def test_aggregation_modes_hand_computed() -> None:
    losses = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = T([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # the last row is empty: left out
    # token-mean: (1 + 2 + 4) / 3
    torch.testing.assert_close(aggregate_loss(losses, mask, mode="token-mean"), T(7 / 3))
    # seq-mean-token-sum: ((1 + 2) + 4) / 2
    torch.testing.assert_close(
        aggregate_loss(losses, mask, mode=LossAggregation.SEQ_MEAN_TOKEN_SUM), T(3.5))
    # seq-mean-token-mean: (1.5 + 4) / 2
    torch.testing.assert_close(aggregate_loss(losses, mask, mode="seq-mean-token-mean"), T(2.75))
    with pytest.raises(ConfigError, match="token-mean"):
        aggregate_loss(losses, mask, mode="sum")
    with pytest.raises(ShapeError):
        aggregate_loss(losses[0], mask[0], mode="token-mean")


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**16))
def test_aggregation_modes_agree_on_full_masks(rows: int, cols: int, seed: int) -> None:
    losses = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(rows, cols)
    token_mean = aggregate_loss(losses, mask, mode="token-mean")
    torch.testing.assert_close(aggregate_loss(losses, mask, mode="seq-mean-token-mean"), token_mean)
    torch.testing.assert_close(aggregate_loss(losses, mask, mode="seq-mean-token-sum"),
                               token_mean * cols)


def test_entropy_hand_computed() -> None:
    # uniform over 2: ln 2 ; probs (1/4, 3/4): -(.25 ln .25 + .75 ln .75)
    logits = T([[0.0, 0.0], [0.0, LN(3)]])
    expected = T([LN(2), -(0.25 * LN(0.25) + 0.75 * LN(0.75))])
    torch.testing.assert_close(entropy_from_logits(logits), expected)


def test_masked_statistics() -> None:
    x, mask = T([1.0, 2.0, 3.0, 4.0]), T([1, 0, 1, 0])
    assert masked_mean(x, mask).item() == 2.0  # (1 + 3) / 2
    assert masked_mean(x, torch.zeros(4)).item() == 0.0  # empty mask: 0, not NaN
    torch.testing.assert_close(masked_mean(T([[1.0, 3.0], [5.0, 0.0]]), T([[1, 1], [1, 0]]),
                                           dim=1), T([2.0, 5.0]))
    assert masked_var(x, mask).item() == 2.0  # ((1-2)^2 + (3-2)^2) / (2 - 1)
    assert masked_var(x, mask, unbiased=False).item() == 1.0
    # whiten: (x - 2) / sqrt(2) on valid entries, 0 on padding
    s = 1 / math.sqrt(2)
    torch.testing.assert_close(masked_whiten(x, mask, eps=0.0), T([-s, 0.0, s, 0.0]))
    torch.testing.assert_close(masked_whiten(x, mask, shift_mean=False, eps=0.0),
                               T([2 - s, 0.0, 2 + s, 0.0]))
