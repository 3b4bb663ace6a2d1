"""The actor's veRL-style loss options against hand-computed values: PPO's critic in an
optimizer group of its own (its learning rate, its gradient clip), the KL to the reference
as a reward penalty with a fixed or adaptive coefficient, and their config checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from dist_train import CONFIG, make_batch

from rlinf.workers.actor import ActorConfig, PolicyTrainer
from rlinf.workers.errors import ConfigError
from rlinf.workers.models import build_char_tokenizer, build_tiny_causal_lm
from rlinf.workers.rollout import RolloutBatch


def _model() -> torch.nn.Module:
    return build_tiny_causal_lm(CONFIG, seed=0, tokenizer=build_char_tokenizer())


def _stepped_gradients(actor: PolicyTrainer) -> list[list[torch.Tensor]]:
    """Make `actor.optimizer.step` record each parameter group's gradients first."""
    seen: list[list[torch.Tensor]] = []
    step = actor.optimizer.step

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.extend([p.grad.clone() for p in group["params"] if p.grad is not None]
                    for group in actor.optimizer.param_groups)
        return step(*args, **kwargs)

    actor.optimizer.step = recording  # type: ignore[method-assign]
    return seen


def _norm(grads: list[torch.Tensor]) -> float:
    return float(torch.stack([g.norm() for g in grads]).norm())


# -- the critic's optimizer --------------------------------------------------------------


def test_the_critic_steps_at_its_own_learning_rate() -> None:
    # Adam's first step moves a parameter by lr * g / (|g| + eps) = lr * sign(g): the value
    # head's bias by the critic's 0.1, every policy weight by at most the policy's 0.001.
    actor = PolicyTrainer(_model(), config=ActorConfig(
        algorithm="ppo", lr=1e-3, critic_lr=0.1, parallelism="none", max_grad_norm=None,
        critic_max_grad_norm=None))
    assert [g["lr"] for g in actor.optimizer.param_groups] == [1e-3, 0.1]
    assert actor.critic is not None
    bias = actor.critic.value_head.bias.detach().clone()
    policy = {k: v.detach().clone() for k, v in actor.model.named_parameters()}
    actor.train(make_batch())
    moved = (actor.critic.value_head.bias.detach() - bias).abs()
    torch.testing.assert_close(moved, torch.full_like(moved, 0.1), rtol=1e-5, atol=0)
    steps = torch.cat([(p.detach() - policy[k]).abs().flatten()
                       for k, p in actor.model.named_parameters()])
    assert float(steps.max()) == pytest.approx(1e-3, rel=1e-4)


def test_critic_gradients_never_shrink_the_policy_step() -> None:
    """A value loss 20000 times heavier: the critic's gradient is clipped to its own 0.5;
    the policy's gradient, its norm and its step stay those of the light one (a shared
    clip would have scaled the policy's by 0.5 / the critic's norm)."""
    batch = make_batch()
    stepped, metrics, params = [], [], []
    for value_coef in (0.5, 1e4):
        actor = PolicyTrainer(_model(), config=ActorConfig(
            algorithm="ppo", lr=1e-2, parallelism="none", value_coef=value_coef,
            max_grad_norm=1.0, critic_max_grad_norm=0.5))
        stepped.append(_stepped_gradients(actor))
        metrics.append(actor.train(batch))
        params.append([p.detach().clone() for p in actor.model.parameters()])
    light, heavy = stepped
    for a, b in zip(light[0], heavy[0], strict=True):  # the policy's group
        assert torch.equal(a, b)
    for a, b in zip(params[0], params[1], strict=True):
        assert torch.equal(a, b)
    assert metrics[0]["grad_norm"] == metrics[1]["grad_norm"]
    assert metrics[1]["critic_grad_norm"] > 1000 * 0.5
    # clipped to 0.5 by its own norm: scaled by 0.5 / (norm + 1e-6)
    assert _norm(heavy[1]) == pytest.approx(0.5, rel=1e-5)


def test_a_checkpoint_restores_both_parameter_groups(tmp_path: Path) -> None:
    batch = make_batch()
    config = ActorConfig(algorithm="ppo", lr=1e-2, critic_lr=3e-2, parallelism="none")
    actor = PolicyTrainer(_model(), config=config)
    actor.train(batch)
    actor.save_checkpoint(str(tmp_path))
    actor.train(batch)
    resumed = PolicyTrainer(_model(), config=config)
    resumed.load_checkpoint(str(tmp_path))
    resumed.train(batch)
    for mine, theirs in zip(resumed.optimizer.param_groups, actor.optimizer.param_groups,
                            strict=True):
        assert mine["lr"] == theirs["lr"]
        for a, b in zip(mine["params"], theirs["params"], strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


# -- KL in the reward --------------------------------------------------------------------


def _with_kl(batch: RolloutBatch, kl: float) -> RolloutBatch:
    """`batch` whose sampling policy is `kl` above the reference on every token (k1)."""
    ref = -torch.ones_like(batch.rollout_log_probs) * batch.response_mask
    return batch.replace(ref_log_probs=ref, old_log_probs=(ref + kl) * batch.response_mask)


def _kl_config(**overrides: object) -> ActorConfig:
    options: dict[str, object] = {"parallelism": "none", "kl_coef": 0.1, "kl_in_reward": True,
                                  "kl_estimator": "kl", "lr": 1e-2}
    return ActorConfig(**(options | overrides))  # type: ignore[arg-type]


def test_ppo_token_rewards_lose_coef_times_kl_before_gae() -> None:
    # make_batch: row r has 2 + r % 3 response tokens; row 1 (3 tokens) is rewarded 1.
    # k1 = 0.5 per token, coef 0.1: every token's reward loses 0.05. The critic's head
    # starts at 0, so with gamma = lam = 1 each return is the sum of the rewards after it.
    actor = PolicyTrainer(_model(), config=_kl_config(
        algorithm="ppo", gamma=1.0, lam=1.0, whiten_advantages=False))
    batch = _with_kl(make_batch(), 0.5)
    penalty, metrics = actor._reward_kl(batch)
    assert metrics == {"reward_kl": pytest.approx(0.5), "reward_kl_coef": 0.1}
    data = actor._prepare(batch, reward_penalty=penalty)
    torch.testing.assert_close(data["returns"][0, :2], torch.tensor([-0.1, -0.05]))
    torch.testing.assert_close(data["returns"][1, :3], torch.tensor([0.85, 0.9, 0.95]))
    torch.testing.assert_close(data["advantages"][1, :3], torch.tensor([0.85, 0.9, 0.95]))
    assert data["returns"][0, 2:].abs().sum() == 0  # padding


def test_grpo_sums_the_penalty_into_each_response_reward() -> None:
    # Group 0: rows of 2, 3, 4, 2 tokens, rewards [0, 1, 0, 0]; penalties 0.05 per token
    # sum to [0.1, 0.15, 0.2, 0.1]: rewards [-0.1, 0.85, -0.2, -0.1], mean 0.1125, and
    # without the std (Dr. GRPO) advantages [-0.2125, 0.7375, -0.3125, -0.2125].
    actor = PolicyTrainer(_model(), config=_kl_config(grpo_normalize_std=False))
    batch = _with_kl(make_batch(), 0.5)
    penalty, _ = actor._reward_kl(batch)
    data = actor._prepare(batch, reward_penalty=penalty)
    torch.testing.assert_close(data["advantages"][:4, 0],
                               torch.tensor([-0.2125, 0.7375, -0.3125, -0.2125]))
    assert "kl" not in actor.metric_keys  # the penalty is in the reward, not the loss
    assert not actor.can_stream  # its controller measures the whole batch


def test_a_fixed_coefficient_stays_and_an_adaptive_one_moves_each_step() -> None:
    batch = _with_kl(make_batch(), 0.5)
    fixed = PolicyTrainer(_model(), config=_kl_config())
    assert [fixed.train(batch)["reward_kl_coef"] for _ in range(2)] == [0.1, 0.1]
    adaptive = PolicyTrainer(_model(), config=_kl_config(kl_ctrl="adaptive", target_kl=0.1,
                                                       kl_horizon=80))
    first = adaptive.train(batch)
    # kl 0.5 against 0.1: error 4 clipped to 0.2; 8 responses: x (1 + 0.2 * 8 / 80) = 1.02
    assert first["reward_kl"] == pytest.approx(0.5)
    assert first["reward_kl_coef"] == 0.1
    assert adaptive.kl_controller is not None
    assert adaptive.kl_controller.value == pytest.approx(0.102)
    # kl 0.09: error -0.1: x (1 - 0.1 * 8 / 80) = 0.99; the step used 0.102
    second = adaptive.train(_with_kl(make_batch(), 0.09))
    assert second["reward_kl_coef"] == pytest.approx(0.102)
    assert adaptive.kl_controller.value == pytest.approx(0.102 * 0.99)


def test_the_adaptive_coefficient_survives_checkpoints_and_snapshots(tmp_path: Path) -> None:
    batch = _with_kl(make_batch(), 0.5)
    config = _kl_config(kl_ctrl="adaptive", kl_horizon=80)
    actor = PolicyTrainer(_model(), config=config)
    actor.train(batch)
    actor.save_checkpoint(str(tmp_path))
    snapshot = actor.snapshot()
    actor.train(batch)
    assert actor.kl_controller is not None
    assert actor.kl_controller.value == pytest.approx(0.102 * 1.02)
    actor.restore(snapshot)
    assert actor.kl_controller.value == pytest.approx(0.102)
    resumed = PolicyTrainer(_model(), config=config)
    resumed.load_checkpoint(str(tmp_path))
    assert resumed.kl_controller is not None
    assert resumed.kl_controller.value == pytest.approx(0.102)


def test_kl_in_reward_needs_a_reference() -> None:
    actor = PolicyTrainer(_model(), config=_kl_config())
    with pytest.raises(ConfigError, match="ref_log_probs"):
        actor.train(make_batch())


@pytest.mark.parametrize(("overrides", "message"), [
    ({"dual_clip": 1.0}, "dual_clip must be > 1"),
    ({"critic_lr": 0.0}, "critic_lr must be > 0"),
    ({"critic_max_grad_norm": 0.0}, "critic_max_grad_norm must be > 0"),
    ({"kl_in_reward": True}, "kl_in_reward needs kl_coef > 0"),
    ({"kl_ctrl": "pid"}, "kl_ctrl must be 'fixed' or 'adaptive'"),
    ({"target_kl": 0.0}, "target_kl must be > 0"),
    ({"kl_horizon": 0}, "kl_horizon >= 1"),
])
def test_bad_loss_options_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ActorConfig(**overrides)  # type: ignore[arg-type]
