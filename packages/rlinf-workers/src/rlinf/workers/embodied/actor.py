"""`EmbodiedActorWorker`: PPO (GAE + critic) or GRPO updates of an actor-critic from rollouts.

PPO follows cleanrl's continuous-control recipe: GAE over the time-major trajectory
(truncations bootstrap from the final observation's value), per-minibatch advantage
whitening, clipped surrogate, optionally clipped value loss, gradient-norm clipping.

GRPO needs no critic: envs run in blocks that start from one identical state
(`EnvWorkerConfig.same_start_group_size`), each env's first episode of the rollout is one
sample, its return is normalised within its block (`grpo_advantages`) and every step of the
episode gets that advantage; steps after the episode's end are masked out.

A rollout policy that lags the actor (the flow's ``policy_lag=1``: the next rollout runs
during this update, with the weights before it) is corrected as decoupled PPO does (Hilton
et al., 2022): the ratio is clipped around the actor's policy before the update (the
proximal policy), and each sample's surrogate is weighed by π_prox / π_behaviour, truncated
at `max_importance_weight`. Without a lag the two policies are one and nothing changes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from rlinf.workers.algorithms import gae, grpo_advantages, ppo_policy_loss
from rlinf.workers.embodied.mlp_ppo import STAT_NAMES, MlpPPOKernel, PPOCoefficients
from rlinf.workers.embodied.ppo_step import MAX_LOG_RATIO, ppo_terms
from rlinf.workers.embodied.vla_policy import VLAActorCritic, VLAPolicyConfig
from rlinf.workers.env.trajectory import Trajectory
from rlinf.workers.errors import ConfigError, ShapeError
from rlinf.workers.models.policy import ActorCritic, PolicyConfig, build_actor_critic
from rlinf.workers.rollout.offload import empty_device_cache, move_module, move_optimizer_state
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.runtime.threads import cpu_threads, set_cpu_threads
from rlinf.workers.runtime.worker import Worker

__all__ = ["EmbodiedActorConfig", "EmbodiedActorWorker", "first_episode_mask"]

# Updates below this many FLOPs run on one thread (see `EmbodiedActorWorker._update_threads`):
# between the 69M of a 64x64 update on 1,024 samples (1 thread faster) and the 465M of a
# 768x768 one on 64 (2 threads faster).
_PARALLEL_UPDATE_FLOPS = 2e8


@dataclass(frozen=True)
class EmbodiedActorConfig:
    """Training of an embodied actor-critic."""

    policy: PolicyConfig | VLAPolicyConfig | None = None
    """Network: an MLP/CNN actor-critic, or a tiny VLA in its task; must match the rollout
    worker's (None: filled in by whoever launches the actor, e.g. the app's flow)."""
    algorithm: Literal["ppo", "grpo"] = "ppo"
    """PPO with a critic and GAE, or critic-free GRPO over blocks of same-start episodes."""
    seed: int = 0
    """Seeds the initial weights (same seed as the rollout worker: same start) and shuffling."""
    lr: float = 3e-4
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_ratio: float = 0.2
    """PPO ratio clip."""
    value_clip: float | None = None
    """Clip range of the value loss around the rollout values (None: plain squared error)."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Gradient-norm clip."""
    epochs: int = 10
    """Passes over each rollout."""
    num_minibatches: int = 32
    """Minibatches per pass."""
    normalize_advantages: bool = True
    """Whiten advantages per minibatch (PPO)."""
    grpo_group_size: int = 4
    """Episodes per GRPO group (= the env worker's `same_start_group_size`)."""
    num_threads: int | None = None
    """Torch intra-op threads of this process (None: torch's default); see rollout.py."""
    device: str = "cpu"
    """Torch device the model, optimizer state and updates live on ("cpu", "cuda",
    "cuda:N"); weights leave as CPU copies and checkpoints load onto it."""
    fused_update: bool = True
    """PPO updates of an MLP Gaussian policy on the CPU by `MlpPPOKernel` (hand-derived
    gradients, faster than autograd at 64-256 wide); False: always autograd. Either
    way the same math, within float32 rounding."""
    policy_lag: int = 0
    """Updates the rollout policy lags this actor by: 0 (it acts with the last update's
    weights) or more (the flow's ``policy_lag=1``), which turns on the correction of the
    module docstring."""
    max_importance_weight: float = 2.0
    """Truncation of π_prox / π_behaviour under a policy lag (bounds one stale sample's
    weight)."""

    def __post_init__(self) -> None:
        if not (self.device == "cpu" or re.fullmatch(r"cuda(:\d+)?", self.device)):
            raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.algorithm not in ("ppo", "grpo"):
            raise ConfigError(f"algorithm must be 'ppo' or 'grpo', got {self.algorithm!r}")
        if self.epochs < 1 or self.num_minibatches < 1 or self.grpo_group_size < 1:
            raise ConfigError(f"epochs, num_minibatches and grpo_group_size must be >= 1, got "
                              f"{self.epochs}, {self.num_minibatches}, {self.grpo_group_size}")
        if self.lr <= 0 or self.max_grad_norm <= 0:
            raise ConfigError(f"lr and max_grad_norm must be > 0, got {self.lr}, "
                              f"{self.max_grad_norm}")
        if self.policy_lag < 0 or not self.max_importance_weight > 0:
            raise ConfigError(f"policy_lag must be >= 0 and max_importance_weight > 0, got "
                              f"{self.policy_lag}, {self.max_importance_weight}")
        if self.clip_ratio < 0 or (self.value_clip is not None and self.value_clip < 0):
            raise ConfigError(f"clip_ratio and value_clip must be >= 0 (value_clip may be None), "
                              f"got {self.clip_ratio}, {self.value_clip}")


def first_episode_mask(terminated: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """``[T, N]`` float mask of each env's steps up to and including its first episode end."""
    done = (terminated | truncated).to(torch.int64)
    ended_before = torch.cumsum(done, dim=0) - done  # episode ends strictly before step t
    return (ended_before == 0).to(torch.float32)


class EmbodiedActorWorker(Worker):
    """Owns the trainable actor-critic and its optimizer (see the module docstring)."""

    def __init__(self, context: WorkerContext, *, config: EmbodiedActorConfig) -> None:
        super().__init__(context)
        self.config = config
        if config.num_threads is not None:
            set_cpu_threads(config.num_threads)
        if config.policy is None:
            raise ConfigError("EmbodiedActorConfig.policy is None: give the actor the network "
                              "it trains (a PolicyConfig or VLAPolicyConfig)")
        self.model: ActorCritic | VLAActorCritic = (
            VLAActorCritic(config.policy, seed=config.seed)
            if isinstance(config.policy, VLAPolicyConfig)
            else build_actor_critic(config.policy, seed=config.seed))
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"EmbodiedActorConfig.device={config.device!r} but this process "
                              "sees no CUDA device: launch it with a GPU or use device='cpu'")
        self.model.to(self.device)  # before the optimizer: its state follows the parameters
        # fused: one kernel over every parameter (CPU and CUDA); per-tensor Adam was a
        # noticeable share of an update at 64x64.
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, eps=1e-5,
                                          fused=True)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.step = 0

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def _targets(self, traj: Trajectory) -> dict[str, torch.Tensor]:
        """Per-sample tensors ``[T, N]``: advantages, returns and the sample mask."""
        rewards = self._tensor(traj.rewards)
        term = self._tensor(traj.terminated)
        trunc = self._tensor(traj.truncated)
        cfg = self.config
        if cfg.algorithm == "ppo":
            adv, ret = gae(rewards.T, self._tensor(traj.values).T,
                           next_values=self._tensor(traj.next_values).T, gamma=cfg.gamma,
                           lam=cfg.gae_lambda, terminated=term.T, truncated=trunc.T)
            return {"advantages": adv.T, "returns": ret.T, "mask": torch.ones_like(rewards)}
        if not np.array_equal(traj.env_indices, np.arange(traj.num_envs)):
            raise ShapeError("GRPO needs the whole env worker's trajectory in env order "
                             f"(Trajectory.concat of every stage), got envs {traj.env_indices}")
        mask = first_episode_mask(term, trunc)
        returns = (rewards * mask).sum(dim=0)
        per_env = grpo_advantages(returns, group_size=cfg.grpo_group_size)
        return {"advantages": per_env.unsqueeze(0) * mask, "returns": torch.zeros_like(rewards),
                "mask": mask}

    def train(self, trajectory: Trajectory) -> dict[str, float]:
        """`epochs` passes of minibatch updates on one rollout; returns mean statistics."""
        cfg = self.config
        with self.measure(batch_size=trajectory.num_steps * trajectory.num_envs):
            targets = self._targets(trajectory)
            flat = {
                "obs": self._tensor(trajectory.obs).flatten(0, 1),
                "actions": self._tensor(trajectory.actions).flatten(0, 1),
                "log_probs": self._tensor(trajectory.log_probs).flatten(0, 1),
                "values": self._tensor(trajectory.values).flatten(0, 1),
                **{k: v.flatten(0, 1) for k, v in targets.items()},
            }
            lag_stats = self._correct_for_lag(flat) if cfg.policy_lag else {}
            stats = {**self._epochs(flat), **lag_stats}
        self.step += 1
        self.log.info("embodied_train", step=self.step, algorithm=cfg.algorithm,
                      **{k: round(v, 5) for k, v in stats.items()})
        return stats

    def _correct_for_lag(self, flat: dict[str, torch.Tensor]) -> dict[str, float]:
        """Replace the behaviour log-probs by the proximal policy's (this actor's, before
        the update) and add each sample's truncated weight π_prox / π_behaviour as
        ``importance`` (module docstring); returns how far the two policies were apart."""
        cfg = self.config
        chunk = max(1, flat["obs"].shape[0] // cfg.num_minibatches)
        with torch.no_grad():
            prox = torch.cat([self.model.evaluate(obs, actions).log_prob for obs, actions in
                              zip(flat["obs"].split(chunk), flat["actions"].split(chunk),
                                  strict=True)])
        log_ratio = (prox - flat["log_probs"]).clamp(min=-MAX_LOG_RATIO, max=MAX_LOG_RATIO)
        ratio = torch.exp(log_ratio)
        flat["log_probs"] = prox
        flat["importance"] = ratio.clamp(max=cfg.max_importance_weight)
        return {"importance_weight": float(flat["importance"].mean()),
                "importance_truncated": float((ratio > cfg.max_importance_weight).float().mean()),
                "behaviour_kl": float((-log_ratio).mean())}

    def _epochs(self, flat: dict[str, torch.Tensor]) -> dict[str, float]:
        cfg = self.config
        size = flat["obs"].shape[0]
        if size < cfg.num_minibatches:
            raise ConfigError(f"num_minibatches={cfg.num_minibatches} exceeds the "
                              f"{size} samples of the rollout")
        self.model.train()
        if cfg.algorithm == "ppo" and cfg.fused_update and MlpPPOKernel.supports(
                self.model, self.optimizer):
            return self._kernel_epochs(flat, size)
        sums: dict[str, float] = {}
        updates = 0
        threads = self._update_threads(size // cfg.num_minibatches, torch.get_num_threads())
        with cpu_threads(threads):
            for _ in range(cfg.epochs):
                # Shuffled on the CPU generator: the same order (and checkpoint) on every device.
                order = torch.randperm(size, generator=self.generator).to(self.device)
                for idx in order.chunk(cfg.num_minibatches):
                    for key, value in self._update({k: v[idx] for k, v in flat.items()}).items():
                        sums[key] = sums.get(key, 0.0) + value
                    updates += 1
        return {key: total / updates for key, total in sums.items()}

    def _kernel_epochs(self, flat: dict[str, torch.Tensor], size: int) -> dict[str, float]:
        """`_epochs` by `MlpPPOKernel`: the same updates without autograd (the same order of
        minibatches from the same generator, so a run can change paths across a resume)."""
        cfg = self.config
        coef = PPOCoefficients(clip_ratio=cfg.clip_ratio, value_clip=cfg.value_clip,
                               value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef,
                               normalize_advantages=cfg.normalize_advantages,
                               max_grad_norm=cfg.max_grad_norm)
        kernel = MlpPPOKernel(self.model, self.optimizer)
        if tuple(flat["obs"].shape) != (size, kernel.obs_dim):
            raise ShapeError(f"observations must be [{size}, {kernel.obs_dim}], got "
                             f"{list(flat['obs'].shape)}")
        arrays = {key: flat[key].numpy().astype(np.float32, copy=False)
                  for key in ("obs", "actions", "log_probs", "values", "advantages", "returns",
                              "importance") if key in flat}
        totals = np.zeros(len(STAT_NAMES))
        updates = 0
        # NumPy's BLAS pool gets the same thread budget as torch's would (`runtime.threads`).
        threads = self._update_threads(size // cfg.num_minibatches, torch.get_num_threads())
        try:
            with cpu_threads(threads):
                for _ in range(cfg.epochs):
                    order = torch.randperm(size, generator=self.generator)
                    for chunk in order.chunk(cfg.num_minibatches):
                        idx = chunk.numpy()
                        mb = {key: value[idx] for key, value in arrays.items()}
                        totals += kernel.step(coef, obs=mb["obs"], actions=mb["actions"],
                                              old_log_probs=mb["log_probs"],
                                              old_values=mb["values"],
                                              advantages=mb["advantages"],
                                              returns=mb["returns"],
                                              importance=mb.get("importance"))
                        updates += 1
        finally:
            kernel.finish()
        return {name: float(total / updates)
                for name, total in zip(STAT_NAMES, totals, strict=True)}

    def _update_threads(self, minibatch: int, budget: int) -> int:
        """Threads (torch's and BLAS's) for updates of `minibatch` samples: the whole
        `budget` (the rank's threads) only where an update is big enough to gain from it. In
        Ray workers on 2 cores, 2 torch threads made 64x64 updates on 64 and on 1,024 samples
        slower, tied at 256x256 on 64, and won from 768x768 on 64 and 256x256 on 1,024. The
        NumPy kernel at 256x256 on 64 gained nothing from a second BLAS thread
        (`runtime.threads`). A fixed rule, not a timing, so that a run and its resumed
        copy train with the same reduction order."""
        if self.device.type != "cpu" or budget <= 1:
            return budget
        params = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        flops = 6 * minibatch * params  # forward + backward, ~2 + 4 per weight and sample
        return budget if flops >= _PARALLEL_UPDATE_FLOPS else 1

    def _update(self, mb: dict[str, torch.Tensor]) -> dict[str, float]:
        cfg = self.config
        ev = self.model.evaluate(mb["obs"], mb["actions"])
        if cfg.algorithm == "ppo":  # every sample valid: the unmasked form, half the ops
            terms = ppo_terms(ev, old_log_probs=mb["log_probs"], old_values=mb["values"],
                              advantages=mb["advantages"], returns=mb["returns"],
                              clip_ratio=cfg.clip_ratio, value_clip=cfg.value_clip,
                              value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef,
                              normalize_advantages=cfg.normalize_advantages,
                              importance=mb.get("importance"))
            self.optimizer.zero_grad(set_to_none=True)
            terms.loss.backward()  # type: ignore[no-untyped-call]
            grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm,
                                                 foreach=True)
            self.optimizer.step()
            names = [*terms.stats, "grad_norm"]
            values = torch.stack([*terms.stats.values(), grad_norm.detach()]).tolist()
            return dict(zip(names, values, strict=True))
        # GRPO: steps after each env's first episode are masked out.
        mask = mb["mask"]
        # The losses take [B, T] token tensors; an env step is a sequence of one token.
        col = {"log_prob": ev.log_prob[:, None], "old": mb["log_probs"][:, None],
               "adv": (mb["advantages"] * mb["importance"] if "importance" in mb
                       else mb["advantages"])[:, None], "mask": mask[:, None]}
        policy = ppo_policy_loss(col["log_prob"], col["old"], col["adv"], col["mask"],
                                 clip_ratio=cfg.clip_ratio)
        entropy = (ev.entropy * mask).sum() / mask.sum().clamp(min=1.0)
        loss = policy.loss - cfg.entropy_coef * entropy
        stats = {"policy_loss": float(policy.loss.detach()),
                 "clip_fraction": float(policy.clip_fraction),
                 "approx_kl": float(policy.approx_kl), "entropy": float(entropy.detach())}
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        stats["grad_norm"] = float(nn.utils.clip_grad_norm_(self.model.parameters(),
                                                            cfg.max_grad_norm, foreach=True))
        self.optimizer.step()
        return stats

    def onload(self) -> None:
        """Move the model and the optimizer state onto `config.device`."""
        move_module(self.model, self.device)
        move_optimizer_state(self.optimizer, self.device)

    def offload(self) -> None:
        """Move the model and the optimizer state to host memory, freeing the device
        (`onload` before training again)."""
        move_module(self.model, "cpu")
        move_optimizer_state(self.optimizer, "cpu")
        empty_device_cache(self.device)

    def get_weights(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the parameters, for `PolicyRolloutWorker.set_weights`."""
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def state(self) -> dict[str, Any]:
        """Everything a resumed run needs: model, optimizer, shuffling RNG and step."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state(), "step": self.step}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of `state`."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.step = int(state["step"])

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write `state()` to `path` (parent directories created)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.state(), target)
        return target

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore a checkpoint written by `save_checkpoint`."""
        # Onto the CPU first: a checkpoint written on a GPU loads anywhere, and
        # load_state_dict copies into the parameters on this actor's device.
        self.load_state(torch.load(Path(path), map_location="cpu", weights_only=False))
