"""PPO updates of a small MLP Gaussian actor-critic on the CPU: hand-derived gradients in
NumPy over flat parameter, gradient and Adam buffers.

At the widths users run (64x64 and 256x256 tanh MLPs, minibatches of 64) an update is
almost all per-op overhead: autograd records and replays ~60 nodes, and torch's fixed cost per
small op and per walk of the optimizer's parameter list outweighs the arithmetic. On one
thread at 64x64 on 64 samples the same math as torch ops without autograd is already
quicker than autograd + fused Adam, and NumPy's ops on these shapes cost a fraction of
torch's.

`MlpPPOKernel` puts the model's parameters, their gradients and the optimizer's Adam state
in one flat buffer each (the model's tensors become views of them, so a checkpoint, the
weights sent to rollout and the torch optimizer all stay the source of truth), runs the
forward pass, writes the gradients by the chain rule (three matmuls and a reduction per
layer), clips the global norm and applies torch's Adam update in place.

The gradients follow autograd's conventions exactly, ties included: `torch.maximum` sends
half the gradient to each side of a tie, and `clamp` passes it at its bounds. Tests hold
the statistics and the parameters after many updates equal to the autograd path's within
float32 rounding.

Covers `ActorCritic` with state observations and continuous actions, on the CPU, under
`torch.optim.Adam` without weight decay, amsgrad or maximize; `supports` says whether a
model and optimizer qualify, and the caller keeps autograd for anything else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rlinf.workers.embodied.ppo_step import MAX_LOG_RATIO
from rlinf.workers.errors import ConfigError
from rlinf.workers.models.policy import ActorCritic, gaussian_mlp_layers

__all__ = ["STAT_NAMES", "MlpPPOKernel", "PPOCoefficients"]

_WHITEN_EPS = 1e-8
_CLIP_EPS = 1e-6  # as nn.utils.clip_grad_norm_
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)

_Layer = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""(weight, bias, weight gradient, bias gradient) of one Linear, views of the flat buffers."""

STAT_NAMES = ("policy_loss", "clip_fraction", "approx_kl", "value_loss", "entropy",
              "grad_norm")
"""The statistics `MlpPPOKernel.step` returns, as the autograd path names them."""


@dataclass(frozen=True)
class PPOCoefficients:
    """The loss's settings (as `EmbodiedActorConfig` names them)."""

    clip_ratio: float
    value_clip: float | None
    value_coef: float
    entropy_coef: float
    normalize_advantages: bool
    max_grad_norm: float


def _tie_shares(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradient shares of ``maximum(a, b)``: all to the larger side, half each on a tie."""
    tie = (a == b) * np.float32(0.5)
    return (a > b) + tie, (a < b) + tie


class MlpPPOKernel:
    """PPO minibatch updates of `model` under `optimizer` (see the module docstring).

    Building one rebinds the model's parameters and the optimizer's state to flat buffers;
    build a new one after either is replaced (a device move, `load_state_dict`), and call
    `finish` after the last update so the optimizer's step counters are current.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if not self.supports(model, optimizer):
            raise ConfigError("MlpPPOKernel needs an MLP ActorCritic with continuous actions "
                              "on the CPU in float32 under plain torch.optim.Adam (check "
                              "MlpPPOKernel.supports, or set EmbodiedActorConfig."
                              "fused_update=False)")
        assert isinstance(model, ActorCritic)
        layers = gaussian_mlp_layers(model)
        assert layers is not None
        self.obs_dim = model.config.obs_shape[0]
        self.optimizer = optimizer
        params = [p for p in model.parameters() if p.requires_grad]
        self.flat_param, self.flat_grad, self.exp_avg, self.exp_avg_sq = (
            torch.zeros(sum(p.numel() for p in params)) for _ in range(4))
        self.steps = self._bind(params)
        self._step_tensors = [optimizer.state[p]["step"] for p in params]
        # NumPy views of the flat buffers, through the parameters `_bind` made views of them.
        self.param_view = {id(p): p.data.numpy() for p in params}
        self.grad_view = {id(p): p.grad.numpy() for p in params if p.grad is not None}
        self.actor, self.critic = ([self._layer(m) for m in trunk] for trunk in layers)
        self.log_std = self.param_view[id(model.log_std)]
        self.log_std_grad = self.grad_view[id(model.log_std)]

    @staticmethod
    def supports(model: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
        """Whether `model` and `optimizer` are what this kernel computes exactly."""
        if gaussian_mlp_layers(model) is None:
            return False
        params = [p for p in model.parameters() if p.requires_grad]
        if not all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params):
            return False
        if type(optimizer) is not torch.optim.Adam or len(optimizer.param_groups) != 1:
            return False
        group = optimizer.param_groups[0]
        return (group["weight_decay"] == 0 and not group["amsgrad"] and not group["maximize"]
                and not isinstance(group["lr"], torch.Tensor)
                and {id(p) for p in group["params"]} == {id(p) for p in params})

    def _bind(self, params: list[nn.Parameter]) -> int:
        """Copy parameters and Adam state into the flat buffers and make them views there;
        returns the optimizer's step count (0 before its first step)."""
        steps: set[int] = set()
        offset = 0
        for p in params:
            size = p.numel()
            window = slice(offset, offset + size)
            self.flat_param[window].copy_(p.detach().reshape(-1))
            p.data = self.flat_param[window].view(p.shape)
            p.grad = self.flat_grad[window].view(p.shape)
            state = self.optimizer.state[p]
            if state:
                self.exp_avg[window].copy_(state["exp_avg"].reshape(-1))
                self.exp_avg_sq[window].copy_(state["exp_avg_sq"].reshape(-1))
                steps.add(int(state["step"]))
            else:
                steps.add(0)
                state["step"] = torch.tensor(0.0)
            state["exp_avg"] = self.exp_avg[window].view(p.shape)
            state["exp_avg_sq"] = self.exp_avg_sq[window].view(p.shape)
            offset += size
        if len(steps) != 1:
            raise ConfigError(f"the optimizer's parameters are at different steps {steps}: "
                              "train with EmbodiedActorConfig.fused_update=False")
        return steps.pop()

    def _layer(self, layer: nn.Linear) -> _Layer:
        assert layer.bias is not None
        return (self.param_view[id(layer.weight)], self.param_view[id(layer.bias)],
                self.grad_view[id(layer.weight)], self.grad_view[id(layer.bias)])

    @staticmethod
    def _forward(layers: list[_Layer], x: np.ndarray) -> list[np.ndarray]:
        """Inputs of every layer then the output: ``[x, h1, ..., out]`` (tanh between)."""
        acts = [x]
        last = len(layers) - 1
        for i, (weight, bias, _, _) in enumerate(layers):
            y = x @ weight.T
            y += bias
            x = y if i == last else np.tanh(y, out=y)
            acts.append(x)
        return acts

    @staticmethod
    def _backward(layers: list[_Layer], acts: list[np.ndarray],
                  grad: np.ndarray) -> None:
        """Every layer's weight and bias gradient from the output's gradient."""
        for i in range(len(layers) - 1, -1, -1):
            weight, _, weight_grad, bias_grad = layers[i]
            np.matmul(grad.T, acts[i], out=weight_grad)
            np.sum(grad, axis=0, out=bias_grad)
            if i:
                hidden = acts[i]  # tanh output: d tanh = 1 - h^2
                grad = grad @ weight
                grad *= 1.0 - hidden * hidden

    def step(self, coef: PPOCoefficients, *, obs: np.ndarray, actions: np.ndarray,
             old_log_probs: np.ndarray, old_values: np.ndarray, advantages: np.ndarray,
             returns: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
        """Loss, gradients, norm clip and an Adam step on one minibatch of float32 arrays
        (``[B, D]`` observations, ``[B, A]`` actions, ``[B]`` the rest; `importance` weighs
        each sample's surrogate after whitening, as `ppo_terms`); returns the statistics
        ``[6]`` in `STAT_NAMES` order."""
        x, act, old_lp, adv, ret = obs, actions, old_log_probs, advantages, returns
        n = x.shape[0]
        actor_acts = self._forward(self.actor, x)
        critic_acts = self._forward(self.critic, x)
        mean, value = actor_acts[-1], critic_acts[-1][:, 0]

        if coef.normalize_advantages and n > 1:
            adv = (adv - adv.mean()) / np.sqrt(adv.var(ddof=1) + _WHITEN_EPS)
        if importance is not None:
            adv = adv * importance
        log_std = self.log_std
        inv_std = np.exp(-log_std)
        z = (act - mean) * inv_std
        z2 = z * z
        action_dim = act.shape[1]
        log_prob = -0.5 * z2.sum(-1) - (log_std.sum() + action_dim * _HALF_LOG_2PI)
        raw_log_ratio = log_prob - old_lp
        log_ratio = np.clip(raw_log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO)
        ratio = np.exp(log_ratio)
        low, high = 1.0 - coef.clip_ratio, 1.0 + coef.clip_ratio
        unclipped, clipped = -adv * ratio, -adv * np.clip(ratio, low, high)
        policy_loss = np.maximum(unclipped, clipped).mean()
        to_unclipped, to_clipped = _tie_shares(unclipped, clipped)
        in_bounds = (ratio >= low) & (ratio <= high)
        in_clamp = np.abs(raw_log_ratio) <= MAX_LOG_RATIO
        # d loss / d log_prob: through max, the ratio clip, exp and the log-ratio clamp.
        g_log_prob = (adv * (-1.0 / n)) * (to_unclipped + to_clipped * in_bounds) * ratio
        g_log_prob *= in_clamp

        errors = value - ret
        if coef.value_clip is None:
            value_loss = 0.5 * (errors * errors).mean()
            g_value = errors * (coef.value_coef / n)
        else:
            old_v = old_values
            delta = value - old_v
            clipped_errors = old_v + np.clip(delta, -coef.value_clip, coef.value_clip) - ret
            sq, sq_clipped = errors * errors, clipped_errors * clipped_errors
            value_loss = 0.5 * np.maximum(sq, sq_clipped).mean()
            to_plain, to_bounded = _tie_shares(sq, sq_clipped)
            in_range = np.abs(delta) <= coef.value_clip
            g_value = (errors * to_plain + clipped_errors * to_bounded * in_range) * (
                coef.value_coef / n)
        entropy = log_std.sum() + action_dim * (0.5 + _HALF_LOG_2PI)

        g_mean = g_log_prob[:, None] * z * inv_std
        # d log_prob / d log_std = z^2 - 1 per sample; the entropy bonus adds -entropy_coef.
        np.subtract(g_log_prob @ z2, g_log_prob.sum() + coef.entropy_coef,
                    out=self.log_std_grad)
        self._backward(self.actor, actor_acts, g_mean)
        self._backward(self.critic, critic_acts, g_value[:, None])

        grad = self.flat_grad.numpy()
        grad_norm = np.sqrt(np.dot(grad, grad))
        scale = coef.max_grad_norm / (grad_norm + _CLIP_EPS)
        if scale < 1.0:
            grad *= scale
        self._adam(grad)
        clip_fraction = (clipped > unclipped).mean()
        return np.array([policy_loss, clip_fraction, -log_ratio.mean(), value_loss, entropy,
                         grad_norm], dtype=np.float64)

    def _adam(self, grad: np.ndarray) -> None:
        """torch.optim.Adam's update (its step order and bias corrections) in place."""
        group = self.optimizer.param_groups[0]
        lr, (beta1, beta2), eps = float(group["lr"]), group["betas"], group["eps"]
        self.steps += 1
        m, v, p = self.exp_avg.numpy(), self.exp_avg_sq.numpy(), self.flat_param.numpy()
        m += (grad - m) * (1.0 - beta1)  # lerp
        v *= beta2
        v += (grad * grad) * (1.0 - beta2)
        denom = np.sqrt(v)
        denom /= math.sqrt(1.0 - beta2 ** self.steps)
        denom += eps
        p -= (m / denom) * (lr / (1.0 - beta1 ** self.steps))

    def finish(self) -> None:
        """Write the step count into the optimizer's per-parameter counters."""
        for counter in self._step_tensors:
            counter.fill_(self.steps)
