"""A VLA as an actor-critic of the embodied workers: rollout inference and PPO.

`VLAActorCritic` puts a `TinyVLA` (built from a `VLAConfig`) or a `PretrainedVLA` (a Hugging
Face checkpoint from a local folder, `PretrainedVLAConfig`) behind the interface the MLP/CNN
`ActorCritic` offers the actor (`evaluate(obs, actions) -> ActionEval`): observations are
camera frames (``uint8 [N, C, H, W]``, `EnvWorkerConfig.pixels`), every row gets the task's
instruction, and the action-token bins over [-1, 1] are mapped affinely onto the env's action
box. The trajectory stores env actions (bin centres mapped onto the box); the actor maps them
back to bin tokens, which round-trips exactly because a bin centre sits half a bin from its
edges.

`VLARolloutWorker` answers the env worker's observation micro-batches like
`PolicyRolloutWorker` (same protocol, same reply fields), decoding one token per action
dimension. Sampling draws from one torch generator seeded by the worker's seed; its state
is part of `state()`, so a resumed run samples what an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rlinf.comm import Batch
from rlinf.workers.embodied.pretrained_vla import PretrainedVLA, PretrainedVLAConfig
from rlinf.workers.embodied.vla import TinyVLA, VLAConfig
from rlinf.workers.errors import ConfigError, ShapeError
from rlinf.workers.models.policy import ActionEval
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.runtime.threads import set_cpu_threads
from rlinf.workers.runtime.worker import Worker

__all__ = ["VLAActorCritic", "VLANetworkConfig", "VLAPolicyConfig", "VLARolloutConfig",
           "VLARolloutWorker", "build_vla"]

VLANetworkConfig = VLAConfig | PretrainedVLAConfig
"""A tiny VLA built from a config, or a pretrained Hugging Face one loaded from a folder."""


def build_vla(config: VLANetworkConfig, *, seed: int) -> TinyVLA | PretrainedVLA:
    """The network of `config` (`seed` initialises the tiny VLA, or the pretrained one's
    value head)."""
    if isinstance(config, PretrainedVLAConfig):
        return PretrainedVLA(config, seed=seed)
    return TinyVLA(config, seed=seed)


@dataclass(frozen=True)
class VLAPolicyConfig:
    """A VLA acting in one task."""

    vla: VLANetworkConfig
    """The network (image shape must equal the env's `pixels` frames, channels first)."""
    action_low: tuple[float, ...]
    """Lower bound of each action dimension (bin -1 maps here)."""
    action_high: tuple[float, ...]
    """Upper bound of each action dimension (bin +1 maps here)."""
    instruction: str
    """Instruction given with every observation."""

    def __post_init__(self) -> None:
        dims = self.vla.action_dim
        if len(self.action_low) != dims or len(self.action_high) != dims:
            raise ConfigError(f"expected {dims} action bounds (VLAConfig.action_dim), got "
                              f"{len(self.action_low)} low and {len(self.action_high)} high")
        if any(h <= lo for lo, h in zip(self.action_low, self.action_high, strict=True)):
            raise ConfigError(f"every action_high must exceed its action_low, got "
                              f"{self.action_low} and {self.action_high}")


class VLAActorCritic(nn.Module):
    """A VLA with env-space actions (see the module docstring)."""

    def __init__(self, config: VLAPolicyConfig, *, seed: int) -> None:
        super().__init__()
        self.config = config
        self.vla = build_vla(config.vla, seed=seed)
        self.low: torch.Tensor
        self.high: torch.Tensor
        self.register_buffer("low", torch.tensor(config.action_low, dtype=torch.float32))
        self.register_buffer("high", torch.tensor(config.action_high, dtype=torch.float32))

    def _instructions(self, count: int) -> list[str]:
        return [self.config.instruction] * count

    def _check(self, obs: torch.Tensor) -> None:
        if tuple(obs.shape[1:]) != self.config.vla.image_shape:
            raise ShapeError(f"expected observations [N, *{self.config.vla.image_shape}] "
                             f"(EnvWorkerConfig.pixels), got {tuple(obs.shape)}")

    def to_env(self, unit: torch.Tensor) -> torch.Tensor:
        """[-1, 1] → the env's action box."""
        low, high = self.low, self.high
        return low + (unit + 1.0) * 0.5 * (high - low)

    def to_tokens(self, action: torch.Tensor) -> torch.Tensor:
        """Env actions → bin indices."""
        unit = (action.float() - self.low) / (self.high - self.low) * 2.0 - 1.0
        return self.vla.action_to_tokens(unit)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """``[N]`` critic estimate."""
        self._check(obs)
        return self.vla.value(obs, self._instructions(len(obs)))

    def act(self, obs: torch.Tensor, *, deterministic: bool,
            generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(env action [N, A], log_prob [N], value [N])``."""
        self._check(obs)
        sample = self.vla.act(obs, self._instructions(len(obs)), deterministic=deterministic,
                              generator=generator)
        return self.to_env(sample.action), sample.log_prob, sample.value

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> ActionEval:
        """Differentiable log-prob, entropy and value of the stored env actions."""
        self._check(obs)
        log_prob, entropy, value = self.vla.evaluate(obs, self._instructions(len(obs)),
                                                     self.to_tokens(action))
        return ActionEval(log_prob=log_prob, entropy=entropy, value=value)


@dataclass(frozen=True)
class VLARolloutConfig:
    """A rollout worker serving a VLA."""

    policy: VLAPolicyConfig
    """The VLA in its task."""
    seed: int = 0
    """Seeds the initial weights and the sampling generator."""
    deterministic: bool = False
    """Decode the most likely bin instead of sampling (evaluation)."""
    device: str = "cpu"
    """Torch device of the model while onloaded."""
    num_threads: int | None = None
    """Torch intra-op threads of this process (None: torch's default)."""


class VLARolloutWorker(Worker):
    """Answers observation micro-batches with VLA actions (module docstring)."""

    def __init__(self, context: WorkerContext, *, config: VLARolloutConfig) -> None:
        super().__init__(context)
        self.config = config
        if config.num_threads is not None:
            set_cpu_threads(config.num_threads)
        self._device = torch.device(config.device)
        self.model = VLAActorCritic(config.policy, seed=config.seed).eval().to(self._device)
        # On the model's device: torch.multinomial samples with a generator of its device.
        self.generator = torch.Generator(device=self._device).manual_seed(config.seed)

    def _tensor(self, array: Any) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array)).to(self._device)

    @torch.no_grad()
    def infer(self, batch: Batch) -> Batch:
        """Same contract as `PolicyRolloutWorker.infer`."""
        obs = self._tensor(batch.tensors["obs"])
        final_mask = np.asarray(batch.tensors["final_mask"], dtype=bool)
        final_value = torch.zeros(len(obs), device=self._device)
        if final_mask.any():
            rows = torch.from_numpy(np.flatnonzero(final_mask))
            final_obs = self._tensor(batch.tensors["final_obs"])[rows]
            final_value[rows] = self.model.value(final_obs)
        if batch.meta.get("bootstrap", False):
            out = {"value": self.model.value(obs), "final_value": final_value}
        else:
            action, log_prob, value = self.model.act(
                obs, deterministic=self.config.deterministic, generator=self.generator)
            out = {"action": action, "log_prob": log_prob, "value": value,
                   "final_value": final_value}
        return Batch({k: v.float().cpu().numpy() for k, v in out.items()},
                     meta=dict(batch.meta))

    def get_weights(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the parameters."""
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load parameters (from the actor)."""
        self.model.load_state_dict(dict(weights))

    def state(self) -> dict[str, Any]:
        """Weights and the sampling generator's position."""
        return {"weights": self.get_weights(), "generator": self.generator.get_state()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Inverse of `state`."""
        self.set_weights(state["weights"])
        self.generator.set_state(state["generator"])

    def onload(self) -> None:
        """Move the model onto its device."""
        self.model.to(self._device)

    def offload(self) -> None:
        """Move the model to host memory."""
        self.model.to("cpu")
