"""The unmasked embodied PPO loss equals the masked token losses on an all-valid batch
(within float32 rounding: torch.var and the masked two-pass variance differ in the last bits)."""

from __future__ import annotations

import pytest
import torch

from rlinf.workers.algorithms import ppo_policy_loss, value_loss
from rlinf.workers.algorithms.masked import masked_whiten
from rlinf.workers.embodied.ppo_step import ppo_terms
from rlinf.workers.models.policy import PolicyConfig, build_actor_critic

COEFS = {"clip_ratio": 0.2, "value_coef": 0.5, "entropy_coef": 0.01}


def _batch(seed: int, size: int = 64) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(size, 5, generator=gen),
            "actions": torch.randn(size, 2, generator=gen),
            # Old log-probs far from the current ones: many ratios clip, some hit the clamp.
            "log_probs": 3 * torch.randn(size, generator=gen) - 4,
            "values": torch.randn(size, generator=gen),
            "advantages": 2 * torch.randn(size, generator=gen) + 0.5,
            "returns": torch.randn(size, generator=gen)}


def _masked_loss(model: torch.nn.Module, mb: dict[str, torch.Tensor], value_clip: float | None,
                 normalize: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss as the masked token functions compute it (each sample one token)."""
    ev = model.evaluate(mb["obs"], mb["actions"])  # type: ignore[operator]
    mask = torch.ones_like(mb["advantages"])
    adv = masked_whiten(mb["advantages"], mask) if normalize else mb["advantages"]
    policy = ppo_policy_loss(ev.log_prob[:, None], mb["log_probs"][:, None], adv[:, None],
                             mask[:, None], clip_ratio=COEFS["clip_ratio"])
    critic = value_loss(ev.value[:, None], mb["values"][:, None], mb["returns"][:, None],
                        mask[:, None], clip_range=value_clip)
    entropy = (ev.entropy * mask).sum() / mask.sum()
    loss = policy.loss + COEFS["value_coef"] * critic.loss - COEFS["entropy_coef"] * entropy
    return loss, {"policy_loss": policy.loss, "clip_fraction": policy.clip_fraction,
                  "approx_kl": policy.approx_kl, "value_loss": critic.loss, "entropy": entropy}


@pytest.mark.parametrize("value_clip", [None, 0.2])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_statistics_and_gradients_equal_the_masked_losses(
        value_clip: float | None, normalize: bool, seed: int) -> None:
    model = build_actor_critic(PolicyConfig(obs_shape=(5,), action_dim=2,
                                            hidden_sizes=(16, 16)), seed=seed)
    mb = _batch(seed)
    expected, expected_stats = _masked_loss(model, mb, value_clip, normalize)
    expected_grads = torch.autograd.grad(expected, list(model.parameters()), allow_unused=True)
    terms = ppo_terms(model.evaluate(mb["obs"], mb["actions"]), old_log_probs=mb["log_probs"],
                      old_values=mb["values"], advantages=mb["advantages"],
                      returns=mb["returns"], value_clip=value_clip,
                      normalize_advantages=normalize, **COEFS)
    grads = torch.autograd.grad(terms.loss, list(model.parameters()), allow_unused=True)
    torch.testing.assert_close(terms.loss, expected)
    for name, value in expected_stats.items():
        torch.testing.assert_close(terms.stats[name], value.detach(), msg=name)
    assert 0.0 < float(terms.stats["clip_fraction"]) < 1.0  # the clip branch was exercised
    for got, want in zip(grads, expected_grads, strict=True):
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want)


def test_importance_weighs_each_samples_surrogate_after_whitening() -> None:
    """Decoupled PPO: ``mean(max(-w A r, -w A clip(r)))`` with A whitened first."""
    model = build_actor_critic(PolicyConfig(obs_shape=(5,), action_dim=2,
                                            hidden_sizes=(16, 16)), seed=0)
    mb = _batch(3)
    weights = torch.rand(64, generator=torch.Generator().manual_seed(4)) * 2
    ev = model.evaluate(mb["obs"], mb["actions"])
    terms = ppo_terms(ev, old_log_probs=mb["log_probs"], old_values=mb["values"],
                      advantages=mb["advantages"], returns=mb["returns"], value_clip=None,
                      normalize_advantages=True, importance=weights, **COEFS)
    adv = mb["advantages"]
    adv = weights * (adv - adv.mean()) / torch.sqrt(adv.var() + 1e-8)
    ratio = torch.exp((ev.log_prob - mb["log_probs"]).clamp(-20, 20))
    want = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
    torch.testing.assert_close(terms.stats["policy_loss"], want.detach())
