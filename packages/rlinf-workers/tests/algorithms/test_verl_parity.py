"""The edges where a veRL config must mean the same here: KL estimators by veRL's names (and
their clamps, gradients included), GRPO's group of one, the truncated importance sampling
against the rollout engine, dual-clip PPO (``clip_ratio_c``) and the adaptive KL
controller. The references are veRL's formulas (`verl/trainer/ppo/core_algos.py`:
`kl_penalty`, `compute_grpo_outcome_advantage`, `compute_policy_loss` with
``rollout_log_probs`` and ``tis_imp_ratio_cap``, `compute_policy_loss_vanilla`,
`AdaptiveKLController`) written out in plain torch."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from rlinf.workers.algorithms import (
    KLController,
    KLEstimator,
    grpo_advantages,
    kl_penalty,
    ppo_policy_loss,
    rollout_correction_weights,
)
from rlinf.workers.errors import ConfigError

# log pi - log pi_ref: ordinary values, both clamps' edges, and far beyond them
LOG_RATIOS = [-100.0, -25.0, -20.0, -3.0, -0.5, 0.0, 1e-4, 0.7, 3.0, 20.0, 25.0, 100.0]


def verl_kl(logprob: torch.Tensor, ref_logprob: torch.Tensor, name: str) -> torch.Tensor:
    """veRL's `kl_penalty(logprob, ref_logprob, kl_penalty=name)`."""
    if name in ("kl", "k1"):
        return logprob - ref_logprob
    if name == "abs":
        return (logprob - ref_logprob).abs()
    if name in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    assert name in ("low_var_kl", "k3")
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


@pytest.mark.parametrize("name", ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"])
def test_kl_estimators_equal_verl_in_value_and_gradient(name: str) -> None:
    ref = torch.full((len(LOG_RATIOS),), -2.0, dtype=torch.float64)
    ours = (ref + torch.tensor(LOG_RATIOS, dtype=torch.float64)).requires_grad_()
    theirs = ours.detach().clone().requires_grad_()
    got, want = kl_penalty(ours, ref, estimator=name), verl_kl(theirs, ref, name)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    got.sum().backward()
    want.sum().backward()
    assert torch.isfinite(ours.grad).all()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-9, atol=1e-9)


def test_low_var_kl_at_a_log_ratio_of_minus_100_has_a_zero_gradient_in_float32() -> None:
    # The case: unclamped, exp(100) overflows float32 and the gradient is NaN; one
    # such token made a whole step NaN with kl_coef > 0.
    log_probs = torch.tensor([-100.0, -1.0], requires_grad=True)
    kl = kl_penalty(log_probs, torch.zeros(2), estimator="low-var-kl")
    kl.sum().backward()
    assert kl[0].item() == 10.0
    assert log_probs.grad is not None and torch.isfinite(log_probs.grad).all()
    assert log_probs.grad[0].item() == 0.0
    # k3 means what it means in veRL: the same clamped estimator.
    torch.testing.assert_close(kl_penalty(log_probs, torch.zeros(2), estimator="k3"), kl)


def test_unclamped_k3_is_schulmans_formula_under_its_own_name() -> None:
    log_ratio = torch.tensor([-20.0, 0.5], dtype=torch.float64)
    got = kl_penalty(log_ratio, torch.zeros(2, dtype=torch.float64), estimator="k3-unclamped")
    torch.testing.assert_close(got, torch.exp(-log_ratio) - 1 + log_ratio)
    assert got[0].item() > 1e8
    assert KLEstimator.parse("low_var_kl") is KLEstimator.LOW_VAR_KL
    with pytest.raises(ConfigError, match="k3-unclamped"):
        kl_penalty(log_ratio, log_ratio, estimator="full")  # needs logits, not log-probs


def verl_grpo(scores: torch.Tensor, index: list[int], *, norm_by_std: bool,
              epsilon: float = 1e-6) -> torch.Tensor:
    """veRL's `compute_grpo_outcome_advantage` on sequence scores with prompt ids `index`."""
    id2score: dict[int, list[torch.Tensor]] = defaultdict(list)
    for i, idx in enumerate(index):
        id2score[idx].append(scores[i])
    id2mean, id2std = {}, {}
    for idx, group in id2score.items():
        if len(group) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            stacked = torch.stack(group)
            id2mean[idx], id2std[idx] = torch.mean(stacked), torch.std(stacked)
    out = scores.clone()
    for i, idx in enumerate(index):
        out[i] = (scores[i] - id2mean[idx]) / (id2std[idx] + epsilon) if norm_by_std \
            else scores[i] - id2mean[idx]
    return out


@pytest.mark.parametrize("group_size", [1, 2, 5])
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_advantages_equal_verl(group_size: int, norm_by_std: bool) -> None:
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.0, 2.0, 1.0, -1.0])
    index = [i // group_size for i in range(len(scores))]
    torch.testing.assert_close(
        grpo_advantages(scores, group_size=group_size, normalize_std=norm_by_std),
        verl_grpo(scores, index, norm_by_std=norm_by_std))


def verl_tis_policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor,
                         rollout_log_prob: torch.Tensor, advantages: torch.Tensor,
                         mask: torch.Tensor, *, clip: float, cap: float) -> torch.Tensor:
    """veRL's vanilla `compute_policy_loss` (token-mean) with ``tis_imp_ratio_cap``: the
    clipped surrogate against the trainer's old log-probs, each token's loss times
    ``clamp(exp(old_log_prob - rollout_log_probs), max=cap)``."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    losses = torch.maximum(-advantages * ratio,
                           -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip))
    tis = torch.clamp(torch.exp(old_log_prob - rollout_log_prob), max=cap)
    losses = losses * tis
    return (losses * mask).sum() / mask.sum()


@pytest.mark.parametrize("cap", [1.0, 2.0, 5.0])
def test_rollout_correction_equals_verl_tis_in_value_and_gradient(cap: float) -> None:
    gen = torch.Generator().manual_seed(0)
    shape = (4, 6)
    old = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
    # the engine's log-probs: near the trainer's, some tokens far off on either side
    rollout = old + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.8
    rollout[0, 0], rollout[1, 1] = old[0, 0] - 30.0, old[1, 1] + 30.0
    advantages = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = (torch.rand(shape, generator=gen) > 0.2).double()
    ours = (old + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.3).requires_grad_()
    theirs = ours.detach().clone().requires_grad_()
    got = ppo_policy_loss(ours, old, advantages, mask, clip_ratio=0.2,
                          token_weights=rollout_correction_weights(old, rollout, cap=cap)).loss
    want = verl_tis_policy_loss(theirs, old, rollout, advantages, mask, clip=0.2, cap=cap)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    got.backward()
    want.backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-9, atol=1e-12)
    weights = rollout_correction_weights(old, rollout, cap=cap)
    assert weights.max() <= cap and weights[0, 0] == cap and weights[1, 1] < 1e-12
    half = rollout_correction_weights(torch.zeros(1, dtype=torch.float16),
                                      torch.full((1,), -30.0, dtype=torch.float16), cap=cap)
    assert half.item() == cap  # exp overflowed float16 to inf; the cap bounds it
    with pytest.raises(ConfigError, match="cap must be > 0"):
        rollout_correction_weights(old, rollout, cap=0.0)


def verl_dual_clip_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor,
                        advantages: torch.Tensor, mask: torch.Tensor, *, clip: float,
                        clip_ratio_c: float) -> tuple[torch.Tensor, torch.Tensor]:
    """veRL's `compute_policy_loss_vanilla` (token-mean): the loss and ``pg_clipfrac_lower``."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    losses1 = torch.maximum(-advantages * ratio,
                            -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip))
    losses3 = -advantages * clip_ratio_c
    lower = (torch.gt(losses1, losses3) * (advantages < 0)).double()
    losses = torch.where(advantages < 0, torch.min(losses3, losses1), losses1)
    return (losses * mask).sum() / mask.sum(), (lower * mask).sum() / mask.sum()


@pytest.mark.parametrize("clip_ratio_c", [1.5, 3.0, 10.0])
def test_dual_clip_equals_verl_clip_ratio_c(clip_ratio_c: float) -> None:
    gen = torch.Generator().manual_seed(1)
    shape = (4, 8)
    old = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
    # ratios from ~0.05 to ~20: every branch of the clip and the dual clip is taken
    ours = (old + torch.randn(shape, generator=gen, dtype=torch.float64) * 1.5).requires_grad_()
    theirs = ours.detach().clone().requires_grad_()
    advantages = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = (torch.rand(shape, generator=gen) > 0.2).double()
    got = ppo_policy_loss(ours, old, advantages, mask, clip_ratio=0.2, dual_clip=clip_ratio_c)
    want, lower = verl_dual_clip_loss(theirs, old, advantages, mask, clip=0.2,
                                      clip_ratio_c=clip_ratio_c)
    torch.testing.assert_close(got.loss, want, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got.dual_clip_fraction, lower)
    got.loss.backward()
    want.backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-9, atol=1e-12)


def test_adaptive_kl_controller_follows_verl() -> None:
    """veRL: ``value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon``."""
    ours = KLController(kind="adaptive", coef=0.05, target=0.1, horizon=500)
    theirs = 0.05
    for kl, responses in ((0.3, 64), (0.11, 64), (0.02, 128), (0.1, 32), (0.0, 64)):
        theirs *= 1 + min(max(kl / 0.1 - 1, -0.2), 0.2) * responses / 500
        assert ours.update(kl, responses=responses) == pytest.approx(theirs, rel=1e-12)
