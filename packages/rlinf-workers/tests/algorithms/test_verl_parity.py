"""The edges where a veRL config must mean the same here: KL estimators by veRL's names (and
their clamps, gradients included) and GRPO's group of one. The references are veRL's
formulas (`verl/trainer/ppo/core_algos.py`: `kl_penalty`, `compute_grpo_outcome_advantage`)
written out in plain torch."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from rlinf.workers.algorithms import KLEstimator, grpo_advantages, kl_penalty
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
