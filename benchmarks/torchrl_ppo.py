"""torchrl's PPO on a gymnasium MuJoCo task, as its users write it: bench-embodied's peer.

The loop follows torchrl's own MuJoCo PPO recipe (``sota-implementations/ppo``): a
collector yields ``frames_per_batch`` transitions, `GAE` writes advantages and value
targets, a `TensorDictReplayBuffer` with `SamplerWithoutReplacement` serves the minibatches
of each epoch, `ClipPPOLoss` gives the losses. What differs from that recipe is what makes
it the same PPO as the other contenders (SB3's ``MlpPolicy`` and rlinf's actor-critic):

- N envs instead of one, as one batched env: gymnasium's synchronous vector env behind
  `GymWrapper`, in the learner's process (``collector="serial"``: a `Collector`), or
  `MultiSyncCollector` with one collector process per core, each stepping its share of the
  envs the same way (``collector="multisync"``, torchrl's multi-process collector).
  ``GymEnv(name, num_envs=N)`` would start gymnasium's async vector env, a process per env:
  on 2 cores with 16 envs its collection took 1.84 s per 2,048 steps against 0.64 s for the
  synchronous one;
- a diagonal Gaussian policy with a state-independent log-std (`IndependentNormal`, as
  SB3 and rlinf), not the recipe's `TanhNormal`; two tanh MLPs of `width` x `width`;
- no observation normalisation (`VecNorm` is off in SB3 and rlinf by default too);
- one Adam over actor and critic, gradient-norm clip 0.5, value coefficient 0.5, no
  entropy bonus, advantages whitened per minibatch, GAE computed once per rollout (the
  recipe recomputes it every epoch, which only costs torchrl more).

`run_torchrl` returns the seconds of each timed iteration (collect + update + the weight
push to the collector's processes) and the machine's CPU-seconds over them; `train_until`
trains until the mean return of the episodes ended in an iteration reaches a threshold.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

Collector = Literal["serial", "multisync"]


@dataclass(frozen=True)
class TorchrlSetting:
    """What the torchrl peer trains: the same knobs as every bench-embodied contender."""

    env: str
    num_envs: int
    rollout_steps: int
    epochs: int
    minibatch_size: int
    width: int
    lr: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_ratio: float = 0.2
    max_grad_norm: float = 0.5
    seed: int = 0


def _gym_env(name: str, count: int, mode: str = "sync") -> Callable[[], Any]:
    """`count` copies of the task as one batched torchrl env: gymnasium's vector env of
    `mode` ("sync": stepped in this process; "async": a process per env, what
    ``GymEnv(num_envs=...)`` builds) wrapped by `GymWrapper`."""
    def make() -> Any:
        import gymnasium
        from torchrl.envs import DoubleToFloat, GymWrapper, RewardSum, TransformedEnv

        # torchrl refuses gymnasium's default next-step autoreset.
        same_step = {"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP}
        vec = gymnasium.make_vec(name, num_envs=count, vectorization_mode=mode,
                                 vector_kwargs=same_step)
        return TransformedEnv(GymWrapper(vec), DoubleToFloat()).append_transform(RewardSum())

    return make


def _models(s: TorchrlSetting) -> tuple[Any, Any]:
    from tensordict.nn import AddStateIndependentNormalScale, TensorDictModule
    from torchrl.envs import ExplorationType
    from torchrl.modules import MLP, IndependentNormal, ProbabilisticActor, ValueOperator

    proof = _gym_env(s.env, 1)()
    obs_dim = proof.observation_spec["observation"].shape[-1]
    action_spec = proof.full_action_spec_unbatched
    act_dim = proof.action_spec_unbatched.shape[-1]
    proof.close()
    torch.manual_seed(s.seed)
    policy_mlp = MLP(in_features=obs_dim, out_features=act_dim, num_cells=[s.width] * 2,
                     activation_class=torch.nn.Tanh)
    value_mlp = MLP(in_features=obs_dim, out_features=1, num_cells=[s.width] * 2,
                    activation_class=torch.nn.Tanh)
    for mlp, gain in ((policy_mlp, 1.0), (value_mlp, 0.01)):
        for layer in mlp.modules():
            if isinstance(layer, torch.nn.Linear):
                torch.nn.init.orthogonal_(layer.weight, gain)
                layer.bias.data.zero_()
    actor = ProbabilisticActor(
        TensorDictModule(torch.nn.Sequential(policy_mlp, AddStateIndependentNormalScale(
            act_dim, scale_lb=1e-8)), in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], spec=action_spec, distribution_class=IndependentNormal,
        return_log_prob=True, default_interaction_type=ExplorationType.RANDOM)
    critic = ValueOperator(value_mlp, in_keys=["observation"])
    return actor, critic


class TorchrlPPO:
    """One torchrl PPO run: `iterate` collects a rollout and updates on it."""

    def __init__(self, s: TorchrlSetting, collector: Collector, *, threads: int) -> None:
        from torchrl.collectors import Collector as SyncCollector
        from torchrl.collectors import MultiSyncCollector
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
        from torchrl.objectives import ClipPPOLoss
        from torchrl.objectives.value import GAE

        torch.set_num_threads(threads)
        self.setting = s
        self.actor, self.critic = _models(s)
        frames = s.num_envs * s.rollout_steps
        if collector == "serial":
            self.collector: Any = SyncCollector(_gym_env(s.env, s.num_envs), self.actor,
                                                frames_per_batch=frames, total_frames=-1)
        else:
            workers = collector_processes(s.num_envs)
            if s.num_envs % workers:
                raise ValueError(f"{s.num_envs} envs do not split over {workers} collector "
                                 "processes")
            self.collector = MultiSyncCollector(
                [_gym_env(s.env, s.num_envs // workers)] * workers, self.actor,
                frames_per_batch=frames, total_frames=-1)
        self.collector.set_seed(s.seed)
        self.advantage = GAE(gamma=s.gamma, lmbda=s.gae_lambda, value_network=self.critic,
                             average_gae=False)
        self.loss = ClipPPOLoss(actor_network=self.actor, critic_network=self.critic,
                                clip_epsilon=s.clip_ratio, entropy_coeff=0.0, critic_coeff=0.5,
                                loss_critic_type="l2", normalize_advantage=True)
        self.optimizer = torch.optim.Adam(self.loss.parameters(), lr=s.lr, eps=1e-5)
        self.buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(frames),
                                             sampler=SamplerWithoutReplacement(),
                                             batch_size=s.minibatch_size)
        self._batches = iter(self.collector)

    def iterate(self) -> float | None:
        """Collect one rollout and run the epochs of updates on it; returns the mean return
        of the episodes that ended in it (None: none ended)."""
        data = next(self._batches)
        done = data["next", "done"].squeeze(-1)
        returns = data["next", "episode_reward"].squeeze(-1)[done]
        with torch.no_grad():
            data = self.advantage(data)
        self.buffer.empty()
        self.buffer.extend(data.reshape(-1))
        params = list(self.loss.parameters())
        for _ in range(self.setting.epochs):
            for batch in self.buffer:
                losses = self.loss(batch)
                total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                self.optimizer.zero_grad()
                total.backward()
                torch.nn.utils.clip_grad_norm_(params, self.setting.max_grad_norm)
                self.optimizer.step()
        self.collector.update_policy_weights_()
        return float(returns.mean()) if returns.numel() else None

    def close(self) -> None:
        self.collector.shutdown()


def collector_processes(num_envs: int) -> int:
    """Collector processes of ``collector="multisync"``: one per core this process may
    use, at most one per env."""
    return max(1, min(num_envs, len(os.sched_getaffinity(0))))


def run_torchrl(s: TorchrlSetting, collector: Collector, *, warmup: int, iterations: int,
                threads: int, busy_seconds: Callable[[], float]) -> tuple[list[float], float]:
    """Seconds of each of `iterations` timed iterations after `warmup` untimed ones, and the
    machine's CPU-seconds (`busy_seconds` before and after) over the timed ones."""
    run = TorchrlPPO(s, collector, threads=threads)
    try:
        for _ in range(warmup):
            run.iterate()
        busy = busy_seconds()
        times = []
        for _ in range(iterations):
            started = time.perf_counter()
            run.iterate()
            times.append(time.perf_counter() - started)
        return times, busy_seconds() - busy
    finally:
        run.close()


def train_until(s: TorchrlSetting, collector: Collector, *, threshold: float,
                budget_s: float, threads: int) -> float:
    """Wall seconds (setup excluded) until an iteration's mean episode return reaches
    `threshold`; ``inf`` when `budget_s` runs out first."""
    run = TorchrlPPO(s, collector, threads=threads)
    try:
        started = time.perf_counter()
        while time.perf_counter() - started < budget_s:
            mean_return = run.iterate()
            if mean_return is not None and mean_return >= threshold:
                return time.perf_counter() - started
        return float("inf")
    finally:
        run.close()
