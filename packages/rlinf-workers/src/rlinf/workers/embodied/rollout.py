"""`PolicyRolloutWorker`: answers observation micro-batches with sampled actions.

Each env draws its sampling noise from its own stream (seeded by the worker's seed and the
env's global index), so the actions an env receives do not depend on the order in which
stages are served: collocated and pipelined rollouts of the same seed and stage groups
produce bit-identical trajectories, and pipelining cannot change what is learned. Across
different groupings they agree up to float rounding (a batched matmul may round a row
differently depending on the micro-batch size).

An MLP Gaussian policy on the CPU answers in NumPy over views of the model's weights: torch's
per-op overhead (six Linear calls, four tanh and the sampling) made a micro-batch of 8
HalfCheetah observations at 64x64 several times slower than NumPy; the math is the same (a test
holds both paths equal within float32 rounding).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from rlinf.comm import Batch
from rlinf.workers.env.link import ActionSource, ObsSink, stage_key
from rlinf.workers.errors import ConfigError, ShapeError
from rlinf.workers.models.policy import (
    ActorCritic,
    PolicyConfig,
    build_actor_critic,
    gaussian_mlp_layers,
)
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.runtime.threads import set_cpu_threads
from rlinf.workers.runtime.worker import Worker

__all__ = ["PolicyRolloutConfig", "PolicyRolloutWorker"]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class PolicyRolloutConfig:
    """Policy of a rollout worker."""

    policy: PolicyConfig
    """Network shape (MLP for state vectors, CNN for images)."""
    seed: int = 0
    """Seeds the initial weights and every env's sampling stream."""
    deterministic: bool = False
    """Act with the distribution's mode instead of sampling (evaluation)."""
    device: str = "cpu"
    """Torch device the policy runs on while onloaded."""
    num_threads: int | None = None
    """Torch intra-op threads of this process (None: torch's default). Tiny policies run
    best with 1: on oversubscribed cores torch's spinning worker threads made a PPO
    iteration many times slower."""


class PolicyRolloutWorker(Worker):
    """Runs the policy on observation micro-batches from env workers (module docstring)."""

    def __init__(self, context: WorkerContext, *, config: PolicyRolloutConfig) -> None:
        super().__init__(context)
        self.config = config
        if config.num_threads is not None:
            set_cpu_threads(config.num_threads)
        self.model: ActorCritic = build_actor_critic(config.policy, seed=config.seed).eval()
        self._device = torch.device(config.device)
        self.model.to(self._device)
        self._streams: dict[int, np.random.Generator] = {}
        self._arrays: _MlpArrays | None = None
        self._bind_arrays()

    def _bind_arrays(self) -> None:
        """NumPy views of an MLP Gaussian policy's weights on the CPU (None otherwise): the
        fast path of `infer`. Views share the parameters' memory, so loading weights in
        place keeps them current; a device move rebinds."""
        self._arrays = _MlpArrays.of(self.model)

    def _stream(self, env_index: int) -> np.random.Generator:
        found = self._streams.get(env_index)
        if found is None:
            found = np.random.Generator(np.random.PCG64([self.config.seed, env_index]))
            self._streams[env_index] = found
        return found

    def _noise_array(self, env_index: npt.NDArray[np.int64], width: int, *,
                     gumbel: bool) -> npt.NDArray[np.float32]:
        out = np.empty((len(env_index), width), dtype=np.float32)
        for row, index in enumerate(env_index.tolist()):
            stream = self._stream(int(index))
            out[row] = stream.gumbel(size=width) if gumbel else stream.standard_normal(width)
        return out

    def _noise(self, env_index: npt.NDArray[np.int64], width: int, *, gumbel: bool) -> torch.Tensor:
        return torch.from_numpy(self._noise_array(env_index, width, gumbel=gumbel)).to(
            self._device)

    def _tensor(self, array: npt.NDArray[np.generic]) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array)).to(self._device)

    @torch.no_grad()
    def infer(self, batch: Batch) -> Batch:
        """Actions, log-probs and values for ``batch["obs"]``; values of ``final_obs`` where
        ``final_mask``. A batch with ``meta["bootstrap"]`` gets values only (no sampling, so
        no env's stream advances)."""
        if self._arrays is not None:
            return self._infer_arrays(self._arrays, batch)
        obs = self._tensor(batch.tensors["obs"])
        env_index = np.asarray(batch.tensors["env_index"], dtype=np.int64)
        final_mask = np.asarray(batch.tensors["final_mask"], dtype=bool)
        count = len(env_index)
        value = self.model.value(obs)
        final_value = torch.zeros(count, device=self._device)
        if final_mask.any():  # full batch, so a row's value does not depend on the others
            mask = torch.from_numpy(final_mask).to(self._device)
            final_value = torch.where(
                mask, self.model.value(self._tensor(batch.tensors["final_obs"])), 0.0)
        out = {"value": value, "final_value": final_value}
        if not batch.meta.get("bootstrap", False):
            action, log_prob = self._sample(obs, env_index)
            out |= {"action": action, "log_prob": log_prob}
        return Batch({k: v.cpu().numpy() for k, v in out.items()}, meta=dict(batch.meta))

    def _infer_arrays(self, arrays: _MlpArrays, batch: Batch) -> Batch:
        """`infer` in NumPy (the module docstring): the torch path's formulas, in its order."""
        obs = np.asarray(batch.tensors["obs"]).astype(np.float32, copy=False)
        if obs.ndim != 2 or obs.shape[1] != arrays.obs_dim:
            raise ShapeError(f"observations must be [N, {arrays.obs_dim}], got "
                             f"{list(obs.shape)}")
        env_index = np.asarray(batch.tensors["env_index"], dtype=np.int64)
        final_mask = np.asarray(batch.tensors["final_mask"], dtype=bool)
        value = arrays.value(obs)
        final_value = np.zeros(len(env_index), dtype=np.float32)
        if final_mask.any():  # full batch, so a row's value does not depend on the others
            final_obs = np.asarray(batch.tensors["final_obs"]).astype(np.float32, copy=False)
            final_value = np.where(final_mask, arrays.value(final_obs), np.float32(0.0))
        out = {"value": value, "final_value": final_value}
        if not batch.meta.get("bootstrap", False):
            mean = arrays.mean(obs)
            if self.config.deterministic:
                z = np.zeros_like(mean)
            else:
                z = self._noise_array(env_index, mean.shape[1], gumbel=False)
            log_std = arrays.log_std
            action = mean + z * np.exp(log_std)
            log_prob = (-0.5 * (z * z) - log_std - np.float32(_HALF_LOG_2PI)).sum(-1)
            out |= {"action": action, "log_prob": log_prob}
        return Batch(out, meta=dict(batch.meta))

    def _sample(self, obs: torch.Tensor, env_index: npt.NDArray[np.int64]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        params = self.model.policy_params(obs)
        cfg = self.config.policy
        if cfg.discrete:
            log_p = torch.log_softmax(params, dim=-1)
            scores = log_p if self.config.deterministic else log_p + self._noise(
                env_index, cfg.action_dim, gumbel=True)  # Gumbel-max = categorical sample
            action = scores.argmax(-1)
            return action, log_p.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        log_std = self.model.log_std.expand_as(params)
        if self.config.deterministic:
            z = torch.zeros_like(params)
        else:
            z = self._noise(env_index, cfg.action_dim, gumbel=False)
        action = params + z * log_std.exp()
        log_prob = (-0.5 * z.square() - log_std - _HALF_LOG_2PI).sum(-1)
        return action, log_prob

    def serve(self, *, source: ActionSource, sink: ObsSink, num_steps: int, num_stages: int,
              timeout: float | None = 60.0) -> int:
        """Answer one env rollout of `num_steps` steps over `num_stages` stage groups
        (``num_steps + 1`` batches per stage, the last for bootstrapping); returns how many
        batches were answered."""
        if num_steps < 1 or num_stages < 1:
            raise ConfigError(f"num_steps and num_stages must be >= 1, got {num_steps}, "
                              f"{num_stages}")
        if self.config.num_threads is not None:
            # OpenMP's thread count is per calling thread: a driver's serving thread would
            # otherwise run with the default and spin (far slower under load).
            set_cpu_threads(self.config.num_threads, rescan=False)
        answered = 0
        for _ in range(num_steps + 1):
            for stage in range(num_stages):
                key = stage_key(stage)
                batch = source.get(key=key, timeout=timeout)
                # No profiler hook per micro-batch: beside a batch this cheap it would show.
                sink.put(self.infer(batch), key=key)
                answered += 1
        return answered

    def get_weights(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the policy's parameters."""
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load parameters (e.g. from `EmbodiedActorWorker.get_weights`)."""
        self.model.load_state_dict(dict(weights))

    def state(self) -> dict[str, Any]:
        """Weights and every env's sampling-stream position (resume continues the streams)."""
        return {"weights": self.get_weights(),
                "streams": {i: g.bit_generator.state for i, g in self._streams.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Inverse of `state`."""
        self.set_weights(state["weights"])
        self._streams = {}
        for index, position in state["streams"].items():
            stream = self._stream(int(index))
            stream.bit_generator.state = position

    def onload(self) -> None:
        """Move the policy onto its device."""
        self.model.to(self._device)
        self._bind_arrays()

    def offload(self) -> None:
        """Move the policy to host memory, freeing its device."""
        self.model.to("cpu")
        self._bind_arrays()


@dataclass(frozen=True)
class _MlpArrays:
    """An MLP Gaussian `ActorCritic`'s weights as NumPy views: ``(weight, bias)`` per layer."""

    actor: list[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]
    critic: list[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]
    log_std: npt.NDArray[np.float32]
    obs_dim: int

    @classmethod
    def of(cls, model: ActorCritic) -> _MlpArrays | None:
        """Views of `model`'s weights, or None where it is not an MLP Gaussian policy in
        float32 on the CPU."""
        layers = gaussian_mlp_layers(model)
        if layers is None or any(p.device.type != "cpu" or p.dtype != torch.float32
                                 for p in model.parameters()):
            return None
        actor, critic = ([(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in trunk]
                         for trunk in layers)
        return cls(actor=actor, critic=critic, log_std=model.log_std.detach().numpy(),
                   obs_dim=model.config.obs_shape[0])

    @staticmethod
    def _forward(layers: list[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]],
                 x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        for weight, bias in layers[:-1]:
            x = x @ weight.T
            x += bias
            np.tanh(x, out=x)
        weight, bias = layers[-1]
        out = x @ weight.T
        out += bias
        return out

    def mean(self, obs: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Gaussian means ``[N, A]``."""
        return self._forward(self.actor, obs)

    def value(self, obs: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Critic estimates ``[N]``."""
        return self._forward(self.critic, obs)[:, 0]
