"""Small actor-critic networks for embodied RL: MLP for state observations, CNN for pixels.

Separate actor and critic trunks (sharing hurts PPO on small continuous-control tasks, as
cleanrl's defaults reflect) with orthogonal initialisation: hidden layers gain sqrt(2), the
policy head 0.01 (near-uniform first actions), the value head 1. Continuous actions are a
diagonal Gaussian with a state-independent learned log-std; discrete actions a categorical.
Sampling takes an optional `torch.Generator` (on the policy's device), so vectorized rollouts
are reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from rlinf.workers.errors import ConfigError, ShapeError

__all__ = ["ActionEval", "ActionSample", "ActorCritic", "PolicyConfig", "build_actor_critic",
           "gaussian_mlp_layers"]

_PIXEL_NDIM = 3


@dataclass(frozen=True)
class PolicyConfig:
    """Shape of an actor-critic for one environment."""

    obs_shape: tuple[int, ...]
    """``(D,)`` for state vectors or ``(C, H, W)`` for images (uint8 0..255 or float)."""
    action_dim: int
    """Action dimensions (continuous) or number of actions (discrete)."""
    discrete: bool = False
    """Categorical policy over `action_dim` actions instead of a Gaussian."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the MLP layers of each trunk (after the CNN for pixels)."""
    cnn_channels: tuple[int, ...] = (16, 32)
    """Channels of the 3x3 stride-2 conv layers used for pixel observations."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy."""

    def __post_init__(self) -> None:
        if len(self.obs_shape) not in (1, _PIXEL_NDIM) or min(self.obs_shape) < 1:
            raise ConfigError(f"obs_shape must be (D,) or (C, H, W) with sizes >= 1, "
                              f"got {self.obs_shape}")
        if self.action_dim < 1 or not self.hidden_sizes:
            raise ConfigError(f"need action_dim >= 1 and at least one hidden layer, got "
                              f"action_dim={self.action_dim}, hidden_sizes={self.hidden_sizes}")


@dataclass(frozen=True)
class ActionSample:
    """What `ActorCritic.act` returns, one row per observation."""

    action: torch.Tensor
    """``[N, action_dim]`` floats (continuous) or ``[N]`` int64 (discrete)."""
    log_prob: torch.Tensor
    """``[N]`` log-probability of `action` under the current policy."""
    value: torch.Tensor
    """``[N]`` critic estimate of the observation."""


@dataclass(frozen=True)
class ActionEval:
    """What `ActorCritic.evaluate` returns for given observations and actions."""

    log_prob: torch.Tensor
    """``[N]`` log-probability of the given actions."""
    entropy: torch.Tensor
    """``[N]`` entropy of the action distribution."""
    value: torch.Tensor
    """``[N]`` critic estimate."""


def _layer(module: nn.Linear | nn.Conv2d, gain: float) -> nn.Linear | nn.Conv2d:
    nn.init.orthogonal_(module.weight, gain)
    if module.bias is not None:
        nn.init.zeros_(module.bias)
    return module


def _trunk(config: PolicyConfig) -> tuple[nn.Sequential, int]:
    """Encoder + MLP; returns the module and its output width."""
    layers: list[nn.Module] = []
    if len(config.obs_shape) == _PIXEL_NDIM:
        channels = config.obs_shape[0]
        for out in config.cnn_channels:
            layers += [_layer(nn.Conv2d(channels, out, 3, stride=2, padding=1), math.sqrt(2)),
                       nn.ReLU()]
            channels = out
        layers.append(nn.Flatten())
        with torch.no_grad():
            width = nn.Sequential(*layers)(torch.zeros(1, *config.obs_shape)).shape[1]
    else:
        width = config.obs_shape[0]
    for hidden in config.hidden_sizes:
        layers += [_layer(nn.Linear(width, hidden), math.sqrt(2)), nn.Tanh()]
        width = hidden
    return nn.Sequential(*layers), width


class ActorCritic(nn.Module):
    """Policy and value networks for one observation/action space (see the module docstring)."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config
        self.actor, width = _trunk(config)
        self.critic, _ = _trunk(config)
        self.policy_head = _layer(nn.Linear(width, config.action_dim), 0.01)
        self.value_head = _layer(nn.Linear(width, 1), 1.0)
        self.log_std = nn.Parameter(torch.full((config.action_dim,), config.init_log_std),
                                    requires_grad=not config.discrete)

    def _prepare(self, obs: torch.Tensor) -> torch.Tensor:
        expected = tuple(self.config.obs_shape)
        if tuple(obs.shape[1:]) != expected:
            raise ShapeError(f"observations must be [N, *{expected}], got {tuple(obs.shape)}")
        if obs.dtype == torch.uint8:  # raw pixels
            return obs.float() / 255.0
        return obs.float()

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """Critic estimate ``[N]``."""
        return self.value_head(self.critic(self._prepare(obs))).squeeze(-1)

    def policy_params(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, A]`` (discrete) or Gaussian means ``[N, A]`` (continuous)."""
        return self.policy_head(self.actor(self._prepare(obs)))

    def _log_prob_entropy(
        self, params: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.config.discrete:
            log_p = torch.log_softmax(params, dim=-1)
            picked = log_p.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            return picked, -(log_p.exp() * log_p).sum(-1)
        log_std = self.log_std.expand_as(params)
        z = (action - params) * torch.exp(-log_std)
        log_prob = (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1)
        return log_prob, entropy

    def act(
        self, obs: torch.Tensor, *, deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> ActionSample:
        """Sample (or take the mode of) the policy for each observation."""
        params = self.policy_params(obs)
        if self.config.discrete:
            if deterministic:
                action = params.argmax(-1)
            else:
                probs = torch.softmax(params, dim=-1)
                action = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        elif deterministic:
            action = params
        else:
            noise = torch.randn(params.shape, generator=generator, dtype=params.dtype,
                                device=params.device)
            action = params + noise * self.log_std.exp()
        log_prob, _ = self._log_prob_entropy(params, action)
        return ActionSample(action=action, log_prob=log_prob, value=self.value(obs))

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> ActionEval:
        """Log-prob and entropy of `action` and the value, differentiable (for PPO)."""
        log_prob, entropy = self._log_prob_entropy(self.policy_params(obs), action)
        return ActionEval(log_prob=log_prob, entropy=entropy, value=self.value(obs))


def build_actor_critic(config: PolicyConfig, *, seed: int) -> ActorCritic:
    """An `ActorCritic` initialised from `seed`; the global torch RNG is left untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ActorCritic(config)


def gaussian_mlp_layers(model: nn.Module) -> tuple[list[nn.Linear], list[nn.Linear]] | None:
    """The Linear layers (with biases) of an `ActorCritic` over state vectors with Gaussian
    actions, actor then critic, each list ending with its head; None for a discrete, pixel
    or otherwise shaped model. What the hand-written NumPy paths (`MlpPPOKernel`, the
    rollout worker's inference) compute."""
    if (not isinstance(model, ActorCritic) or model.config.discrete
            or len(model.config.obs_shape) != 1):
        return None
    trunks = []
    for trunk, head in ((model.actor, model.policy_head), (model.critic, model.value_head)):
        modules = [*trunk, head]
        linears = [m for m in modules[0::2] if isinstance(m, nn.Linear)]
        if (len(linears) != len(modules[0::2]) or any(m.bias is None for m in linears)
                or not all(isinstance(m, nn.Tanh) for m in modules[1::2])):
            return None
        trunks.append(linears)
    return trunks[0], trunks[1]
