"""Advantage estimators: GAE, discounted returns and GRPO group-normalised advantages.

Convention: time is the LAST dimension (``[..., T]``), matching token-level tensors ``[B, T]``;
embodied rollouts stored time-major ``[T, N]`` pass ``x.T``.

Episode ends come in two kinds, and they bootstrap differently:

- ``terminated[t]``: the episode really ended after step t (goal, failure, EOS). Nothing
  follows, so the target is ``r_t`` alone.
- ``truncated[t]``: the episode was cut after step t (time limit, rollout horizon for a single
  env) although it could have continued. The target bootstraps from ``next_values[t]``, the
  value of the observation the env would have continued from (vectorized envs report it as
  the final observation before their auto-reset).

In both cases the GAE trace does not cross into the next episode. ``next_values[t]`` is the
value of the observation after step t; `bootstrap_next_values` builds it from per-step values
and the value after the last step when no truncation needs special final-observation values.
"""

from __future__ import annotations

import torch

from rlinf.workers.algorithms.masked import check_same_shape
from rlinf.workers.errors import ConfigError, ShapeError

__all__ = [
    "bootstrap_next_values",
    "broadcast_to_tokens",
    "discounted_returns",
    "gae",
    "grpo_advantages",
    "place_at_last_token",
]


def bootstrap_next_values(values: torch.Tensor, last_value: torch.Tensor) -> torch.Tensor:
    """``next_values[..., t] = values[..., t + 1]`` and ``last_value`` after the final step.

    ``values`` is ``[..., T]``; ``last_value`` is ``[...]`` (the value after step T-1).
    """
    if tuple(last_value.shape) != tuple(values.shape[:-1]):
        raise ShapeError(
            f"last_value must have shape {tuple(values.shape[:-1])} (values without its time "
            f"dimension), got {tuple(last_value.shape)}"
        )
    return torch.cat([values[..., 1:], last_value.unsqueeze(-1).to(values.dtype)], dim=-1)


def _episode_flags(
    like: torch.Tensor, terminated: torch.Tensor | None, truncated: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(terminated, done) as bool tensors shaped like `like`; done = terminated | truncated."""
    term = torch.zeros_like(like, dtype=torch.bool) if terminated is None else terminated.bool()
    trunc = torch.zeros_like(like, dtype=torch.bool) if truncated is None else truncated.bool()
    check_same_shape(rewards=like, terminated=term, truncated=trunc)
    return term, term | trunc


def _check_discount(gamma: float, lam: float = 1.0) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ConfigError(f"gamma must be in [0, 1], got {gamma}")
    if not 0.0 <= lam <= 1.0:
        raise ConfigError(f"lam (GAE lambda) must be in [0, 1], got {lam}")


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    *,
    next_values: torch.Tensor,
    gamma: float,
    lam: float,
    terminated: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation; returns ``(advantages, returns)``, each ``[..., T]``.

    ``delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t`` and
    ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}`` with ``A_T = 0``, where
    ``done = terminated | truncated``. ``returns = advantages + values`` (the value target).
    """
    check_same_shape(rewards=rewards, values=values, next_values=next_values)
    _check_discount(gamma, lam)
    term, done = _episode_flags(rewards, terminated, truncated)
    not_term = (~term).to(rewards.dtype)
    not_done = (~done).to(rewards.dtype)
    deltas = rewards + gamma * not_term * next_values - values
    advantages = torch.empty_like(deltas)
    running = torch.zeros_like(deltas[..., 0])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = deltas[..., t] + gamma * lam * not_done[..., t] * running
        advantages[..., t] = running
    return advantages, advantages + values


def discounted_returns(
    rewards: torch.Tensor,
    *,
    gamma: float,
    terminated: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
    next_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """Discounted returns-to-go ``G_t``, ``[..., T]``.

    ``G_t = r_t + gamma * (1 - terminated_t) * C_t`` where the continuation ``C_t`` is
    ``next_values_t`` after a truncation or the last step, else ``G_{t+1}``. Without
    ``next_values`` nothing is bootstrapped (returns of complete episodes, e.g. LLM responses).
    """
    _check_discount(gamma)
    nv = torch.zeros_like(rewards) if next_values is None else next_values
    check_same_shape(rewards=rewards, next_values=nv)
    term, done = _episode_flags(rewards, terminated, truncated)
    not_term = (~term).to(rewards.dtype)
    returns = torch.empty_like(rewards)
    following = nv[..., -1]
    for t in range(rewards.shape[-1] - 1, -1, -1):
        continuation = torch.where(done[..., t], nv[..., t], following)
        following = rewards[..., t] + gamma * not_term[..., t] * continuation
        returns[..., t] = following
    return returns


def grpo_advantages(
    rewards: torch.Tensor, *, group_size: int, eps: float = 1e-6, normalize_std: bool = True
) -> torch.Tensor:
    """GRPO advantages: each reward minus its group's mean, over the group's std + eps.

    ``rewards`` is ``[N]`` with ``N = num_groups * group_size`` and each group (the responses
    to one prompt) contiguous. The std is unbiased (Bessel), as in GRPO's reference code. A
    group of one has no baseline: as veRL does, its mean is taken as 0 and its std as 1, so
    its advantage is the raw reward (over 1 + eps). ``normalize_std=False`` skips the
    division (Dr. GRPO), which keeps the scale of rewards and avoids over-weighting easy
    prompts.
    """
    if rewards.ndim != 1:
        raise ShapeError(
            f"rewards must be 1-D [num_groups * group_size], got {tuple(rewards.shape)}"
        )
    if group_size < 1 or rewards.shape[0] % group_size != 0:
        raise ConfigError(
            f"group_size must be >= 1 and divide the number of rewards ({rewards.shape[0]}), "
            f"got {group_size}"
        )
    if group_size == 1:
        return rewards / (1.0 + eps) if normalize_std else rewards.clone()
    grouped = rewards.reshape(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if normalize_std:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


def broadcast_to_tokens(seq_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Give every valid token of sequence i the value ``seq_values[i]``: ``[B]`` → ``[B, T]``."""
    if mask.ndim != 2 or tuple(seq_values.shape) != (mask.shape[0],):
        raise ShapeError(
            f"expected seq_values [B] and mask [B, T], got {tuple(seq_values.shape)} and "
            f"{tuple(mask.shape)}"
        )
    return seq_values.unsqueeze(-1) * mask.to(seq_values.dtype)


def place_at_last_token(seq_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-level tensor that is 0 except ``seq_values[i]`` at the last valid token of row i.

    Turns an outcome reward into the per-token reward that PPO with a critic discounts.
    Rows with no valid token stay all zero.
    """
    token_values = broadcast_to_tokens(seq_values, mask)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask.bool(), positions, -1).max(dim=1).values
    at_last = positions == last.unsqueeze(-1)
    return torch.where(at_last, token_values, torch.zeros_like(token_values))
