"""`PolicyTrainer`: trains the policy (and PPO's critic) on scored rollout batches.

One `train` call = ``epochs`` passes over the batch; each pass splits it into mini-batches
(one optimizer step each) and each mini-batch into micro-batches whose gradients
accumulate. Each micro-batch's loss is weighted by its share of the mini-batch's loss units
(tokens for token-mean, sequences for the seq-mean modes), so the accumulated gradient is
exactly the gradient of the mini-batch's aggregated loss, whatever the micro-batch size and
whichever rows go together. That freedom is used: micro-batches gather rows of similar
response length and drop the padding columns no row of theirs uses, so short responses
are not computed out to the longest one's length (padding costs nothing in the loss, but a
forward/backward over it costs as much as over real tokens).
Under data parallelism every rank trains on its own shard; each micro-batch's loss is
weighted by its share of all ranks' units, and gradients are summed over ranks once per
optimizer step. With ``precision="bf16"`` forwards run under bf16 autocast over the fp32
parameters.

PPO's critic trains in a parameter group of its own (its learning rate) and its gradient
is clipped by its own norm, so the value loss never shrinks the policy's step. With
``kl_in_reward`` each step's token rewards lose the controller's coefficient times the KL
of the sampling policy to the reference before advantages, and the controller moves once
per step from the KL the whole batch measured (`rlinf.workers.algorithms.kl_control`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import structlog
import torch
from torch import nn

from rlinf.workers.actor import checkpoint as ckpt
from rlinf.workers.actor.config import ActorConfig
from rlinf.workers.actor.critic import TokenValueModel, build_critic_from_policy
from rlinf.workers.actor.lora import (
    adapter_named_tensors,
    apply_lora,
    is_lora_model,
    merged_named_tensors,
)
from rlinf.workers.actor.parallel import full_named_tensors, is_distributed, unwrap, wrap
from rlinf.workers.algorithms import (
    KLController,
    LossAggregation,
    aggregate_loss,
    bootstrap_next_values,
    broadcast_to_tokens,
    gae,
    grpo_advantages,
    kl_penalty,
    kl_reward_penalty,
    masked_whiten,
    place_at_last_token,
    ppo_policy_loss,
    rollout_correction_weights,
    value_loss,
)
from rlinf.workers.errors import ConfigError
from rlinf.workers.models import (
    compute_precision,
    response_log_probs,
    response_log_probs_and_entropy,
)
from rlinf.workers.models.attention import attention_kernel, training_attention
from rlinf.workers.rollout.batch import RolloutBatch
from rlinf.workers.rollout.offload import empty_device_cache, move_module, move_optimizer_state
from rlinf.workers.weight_sync.buckets import Bucket, iter_buckets

__all__ = ["PolicyTrainer", "kl_controller_for"]

_log = structlog.get_logger(__name__)

_WHITEN_EPS = 1e-8  # as masked_whiten

_KL_COEF_KEY = "kl_in_reward_coef"
"""Where checkpoints and snapshots keep the KL reward controller's coefficient."""


def kl_controller_for(config: ActorConfig) -> KLController | None:
    """The KL reward controller of `config` (None without ``kl_in_reward``)."""
    if not config.kl_in_reward:
        return None
    return KLController(kind=config.kl_ctrl, coef=config.kl_coef, target=config.target_kl,
                        horizon=config.kl_horizon)


def optimizer_groups(config: ActorConfig, policy: list[nn.Parameter],
                     critic: list[nn.Parameter]) -> list[dict[str, Any]]:
    """AdamW's parameter groups: the policy's, then the critic's at its own rate (none
    without a critic)."""
    groups: list[dict[str, Any]] = [{"params": policy, "lr": config.lr}]
    if critic:
        groups.append({"params": critic, "lr": config.critic_learning_rate})
    return groups


class PolicyTrainer:
    """Policy trainer (see the module docstring)."""

    def __init__(
        self, model: nn.Module, *, config: ActorConfig | None = None,
        critic: TokenValueModel | None = None, device: torch.device | str | None = None,
    ) -> None:
        """Train `model` on `device`; with ``algorithm="ppo"`` a critic is built from it
        unless given. If a process group is initialised, the modules are wrapped per
        ``config.parallelism`` (every rank must construct its worker from equal weights)."""
        config = config or ActorConfig()
        self.config = config
        self.device = torch.device(device) if device is not None else next(
            model.parameters()).device
        move_module(model, self.device)
        if config.algorithm == "ppo" and critic is None:
            critic = build_critic_from_policy(model)
        if critic is not None:
            move_module(critic, self.device)
        if config.lora is not None:  # after the critic: it trains in full
            model = apply_lora(model, config.lora)
        self.policy = wrap(model, parallelism=config.parallelism, device=self.device)
        self.critic = None if critic is None else wrap(
            critic, parallelism=config.parallelism, device=self.device)
        self.policy.train()
        if self.critic is not None:
            self.critic.train()
        critic_params = [] if self.critic is None else list(self.critic.parameters())
        self.optimizer = torch.optim.AdamW(
            optimizer_groups(config, [p for p in self.policy.parameters() if p.requires_grad],
                             critic_params),
            lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
        self.global_step = 0
        self._agg = LossAggregation.parse(config.aggregation)
        self.kl_controller = kl_controller_for(config)

    # -- training --------------------------------------------------------------------------

    def train(self, batch: RolloutBatch) -> dict[str, float]:
        """Run ``epochs`` passes of optimizer steps on `batch`; returns mean metrics."""
        cfg = self.config
        if batch.rewards is None:
            raise ConfigError("the batch has no rewards; run the reward worker first")
        if cfg.kl_coef > 0 and batch.ref_log_probs is None:
            raise ConfigError("kl_coef > 0 needs ref_log_probs (a reference inference worker)")
        penalty, reward_metrics = self._reward_kl(batch)
        data = self._prepare(batch, reward_penalty=penalty)
        rows = batch.num_rows
        mini = cfg.mini_batch_size or rows
        history: dict[str, list[float]] = {}
        for _ in range(cfg.epochs):
            for start in range(0, rows, mini):
                metrics = self._optimizer_step(data, slice(start, min(start + mini, rows)))
                for key, value in metrics.items():
                    history.setdefault(key, []).append(value)
        result = {key: sum(v) / len(v) for key, v in history.items()} | reward_metrics
        _log.info("actor_trained", step=self.global_step, **result)
        return result

    def _reward_kl(self, batch: RolloutBatch) -> tuple[torch.Tensor | None, dict[str, float]]:
        """With ``kl_in_reward``: the ``[B, R]`` penalty ``coef * kl`` of `batch`'s tokens
        (the KL of the policy that sampled it: its old log-probs, else the rollout's), and
        the metrics ``reward_kl`` (the KL every rank's batch measured) and
        ``reward_kl_coef`` (the coefficient it was penalised with); the controller then
        moves. Otherwise ``(None, {})``."""
        controller = self.kl_controller
        if controller is None:
            return None, {}
        sampled = batch.old_log_probs if batch.old_log_probs is not None \
            else batch.rollout_log_probs
        if batch.ref_log_probs is None:
            raise ConfigError("kl_in_reward needs ref_log_probs (a reference inference "
                              "worker)")
        coef = controller.value
        penalty = kl_reward_penalty(sampled.to(self.device), batch.ref_log_probs.to(self.device),
                                    batch.loss_mask.to(self.device), coef=coef,
                                    estimator=self.config.kl_estimator)
        kl_sum, responses = self._sum_over_batch(penalty.kl_sum, float(penalty.responses))
        current = kl_sum / responses if responses else 0.0
        controller.update(current, responses=int(responses))
        return penalty.penalty, {"reward_kl": current, "reward_kl_coef": coef}

    def _sum_over_batch(self, *values: float) -> list[float]:
        """`values` summed over the ranks that hold the batch between them (`_batch_group`;
        a collective under data parallelism), else as they are."""
        if not is_distributed():
            return list(values)
        import torch.distributed as dist

        summed = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(summed, group=self._batch_group())
        return [float(v) for v in summed.tolist()]

    # -- streaming: gradients of micro-batches as they arrive, one step at the end ------------

    @property
    def can_stream(self) -> bool:
        """Whether `accumulate`/`step_accumulated` apply (`ActorConfig.can_stream`)."""
        return self.config.can_stream(distributed=is_distributed())

    def accumulate(self, batch: RolloutBatch) -> tuple[float, dict[str, float]]:
        """Forward/backward `batch` (whole groups) without stepping; returns its loss units
        and its metrics summed over them.

        Gradients accumulate as the *sum* of per-unit losses; `step_accumulated` divides by
        the total units, so the step equals that of the aggregated loss of every batch
        accumulated since the last step. Under DDP no gradient is synchronised here.
        """
        if not self.can_stream:
            raise ConfigError("accumulate needs GRPO with epochs=1, mini_batch_size=None and "
                              "no FSDP2; use train() for this config")
        if batch.rewards is None:
            raise ConfigError("the batch has no rewards; run the reward worker first")
        data = self._prepare(batch)
        total = self._units(data["loss_mask"])
        sums: dict[str, float] = {}
        for micro in self._micro_batches(data, torch.arange(batch.num_rows)):
            units = self._units(micro["loss_mask"])
            if units == 0:
                continue
            # The unwrapped model: no DDP collective (buffer broadcast, gradient all-reduce)
            # runs per micro-batch; `reduce_accumulated` sums the gradients once, at the end.
            loss, metrics = self._micro_loss(micro, policy=unwrap(self.policy))
            (loss * units).backward()
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value * units
        return total, sums

    def reduce_accumulated(
        self, units: float, metric_sums: dict[str, float]
    ) -> tuple[float, dict[str, float]]:
        """Under DDP, sum the accumulated gradients, units and metric sums over all ranks (a
        collective: every rank calls it, also one that received nothing); else return them
        as is."""
        if not is_distributed():
            return units, dict(metric_sums)
        self._all_reduce_gradients()
        return self._sum_over_ranks(units, metric_sums)

    def _sum_over_ranks(self, units: float,
                        metric_sums: dict[str, float]) -> tuple[float, dict[str, float]]:
        """`units` and every metric of `metric_keys` summed over the ranks (0 where a rank
        has none)."""
        import torch.distributed as dist

        keys = self.metric_keys
        counted = torch.tensor([units, *(metric_sums.get(k, 0.0) for k in keys)],
                               dtype=torch.float64, device=self.device)
        dist.all_reduce(counted)
        values = counted.tolist()
        return float(values[0]), dict(zip(keys, values[1:], strict=True))

    def _all_reduce_gradients(self, group: Any = None,
                              params: list[torch.Tensor] | None = None) -> None:
        """Sum the gradients of `params` (default: every optimised parameter) over the ranks
        of `group` (default: all) in one flat buffer (a rank that computed none contributes
        zeros)."""
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        if params is None:
            params = [p for each in self.optimizer.param_groups for p in each["params"]]
        grads: list[torch.Tensor] = []
        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grads.append(param.grad)
        if not grads:
            return
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=group)
        for grad, summed in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(summed)

    @property
    def metric_keys(self) -> tuple[str, ...]:
        """Names of the per-micro-batch training metrics this config reports."""
        keys = ["advantage_mean", "approx_kl", "clip_fraction", "entropy", "policy_loss"]
        if self.config.kl_loss:
            keys.append("kl")
        if self.config.dual_clip is not None:
            keys.append("dual_clip_fraction")
        if self.config.rollout_correction_cap is not None:
            keys.append("rollout_correction_weight")
        if self.critic is not None:
            keys += ["value_clip_fraction", "value_loss"]
        return tuple(sorted(keys))

    def step_accumulated(self, units: float, metric_sums: dict[str, float]) -> dict[str, float]:
        """Average the accumulated gradients over `units` (after `reduce_accumulated` under
        DDP: every rank's), clip, step; returns the metrics averaged over those units, plus
        ``grad_norm``."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        result = {key: value / units for key, value in metric_sums.items()} if units else {}
        if units > 0:
            for param in params:
                if param.grad is not None:
                    param.grad.div_(units)
            result.update(self._clip_gradients())
            self.optimizer.step()
            self.global_step += 1
        self.optimizer.zero_grad(set_to_none=True)
        return result

    def _prepare(self, batch: RolloutBatch, *,
                 reward_penalty: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Batch tensors on device plus advantages (and PPO's old values and returns).
        `reward_penalty` (``[B, R]``, `_reward_kl`) is subtracted from the token rewards
        first: PPO's per token, GRPO's summed into each response's reward (as veRL)."""
        cfg = self.config
        dev = self.device
        data = {name: getattr(batch, name).to(dev) for name in (
            "prompt_ids", "prompt_mask", "response_ids", "response_mask")}
        # The forwards attend over every response token; the loss, the advantages and the
        # KL count only the model's own (a multi-turn batch's observations are the tools').
        data["loss_mask"] = batch.loss_mask.to(dev)
        mask = data["loss_mask"].float()
        if cfg.rollout_correction_cap is None:
            old = batch.old_log_probs if batch.old_log_probs is not None \
                else batch.rollout_log_probs
            data["old_log_probs"] = old.to(dev)
        elif batch.old_log_probs is not None:
            data["old_log_probs"] = batch.old_log_probs.to(dev)
            data["rollout_weights"] = rollout_correction_weights(
                data["old_log_probs"], batch.rollout_log_probs.to(dev),
                cap=cfg.rollout_correction_cap)
        elif cfg.single_update:
            # pi_old is the policy being updated: `_loss_terms` takes its log-probs from the
            # training forward and weighs them against these.
            data["rollout_log_probs"] = batch.rollout_log_probs.to(dev)
        else:
            raise ConfigError("rollout_correction_cap weighs tokens by pi_old / pi_rollout; "
                              "with several optimizer steps per batch (epochs > 1, "
                              "mini-batches or a policy lag) pi_old must be recomputed by "
                              "the trainer's model before the first: enable the recompute "
                              "(recompute_logprobs) or drop the cap")
        if batch.ref_log_probs is not None:
            data["ref_log_probs"] = batch.ref_log_probs.to(dev)
        rewards = batch.rewards.to(dev).float()  # type: ignore[union-attr]
        if cfg.algorithm == "grpo":
            if reward_penalty is not None:
                rewards = rewards - (reward_penalty * mask).sum(dim=-1)
            seq_adv = grpo_advantages(rewards, group_size=batch.group_size,
                                      normalize_std=cfg.grpo_normalize_std)
            data["advantages"] = broadcast_to_tokens(seq_adv, mask)
            return data
        with torch.no_grad():
            values = self._values(data, slice(None)) * mask
        token_rewards = place_at_last_token(rewards, mask)
        if reward_penalty is not None:
            token_rewards = token_rewards - reward_penalty * mask
        # Every response ends at its last valid token (EOS or the length limit: either way
        # the outcome reward closes the episode), so nothing is bootstrapped after it.
        last = place_at_last_token(torch.ones_like(rewards), mask).bool()
        advantages, returns = gae(
            token_rewards, values, gamma=cfg.gamma, lam=cfg.lam, terminated=last,
            next_values=bootstrap_next_values(values, torch.zeros_like(rewards)))
        if cfg.whiten_advantages:
            advantages = self._whiten(advantages, mask)
        data.update(advantages=advantages * mask, returns=returns * mask, old_values=values)
        return data

    def _whiten(self, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`masked_whiten` over the whole batch: under data parallelism each rank holds a
        shard, and whitening it alone would make PPO depend on the number of ranks. Mean
        then unbiased variance, each one all-reduce of two float64 scalars (a collective:
        every rank prepares its shard in `train`)."""
        if not is_distributed():
            return masked_whiten(advantages, mask)
        import torch.distributed as dist

        group = self._batch_group()
        values, weights = advantages.to(torch.float64), mask.to(torch.float64)
        moments = torch.stack([(values * weights).sum(), weights.sum()])
        dist.all_reduce(moments, group=group)
        total, count = moments.tolist()
        mean = total / count if count > 0 else 0.0
        spread = ((values - mean).square() * weights).sum().reshape(1)
        dist.all_reduce(spread, group=group)
        var = spread.item() / (count - 1) if count > 1 else 0.0
        return ((advantages - mean) * (var + _WHITEN_EPS) ** -0.5) * mask

    def _batch_group(self) -> Any:
        """The process group whose ranks hold the batch between them, one shard each
        (None: every rank; backends whose ranks share rows narrow it)."""
        return None

    def _values(self, data: dict[str, torch.Tensor], rows: slice, *,
                critic: nn.Module | None = None) -> torch.Tensor:
        critic = critic if critic is not None else self.critic
        if critic is None:
            raise ConfigError("PPO needs a critic; this actor was built without one")
        # One kernel for the old values and the trained ones: the value clip compares them.
        with compute_precision(self.config.precision, self.device), \
                attention_kernel(critic, self._training_attention()):
            result: torch.Tensor = critic(
                prompt_ids=data["prompt_ids"][rows], prompt_mask=data["prompt_mask"][rows],
                response_ids=data["response_ids"][rows],
                response_mask=data["response_mask"][rows])
        return result.float()

    def _units(self, mask: torch.Tensor) -> float:
        if self._agg is LossAggregation.TOKEN_MEAN:
            return float(mask.sum())
        return float((mask.sum(dim=-1) > 0).sum())

    def _optimizer_step(self, data: dict[str, torch.Tensor], rows: slice) -> dict[str, float]:
        """One optimizer step on `rows`: every rank's micro-batches weigh by their share of
        all ranks' loss units, so the step equals one process training on the whole
        mini-batch. With a process group and no FSDP2 (DDP, or no wrapper) the gradients are
        summed by hand once at the end (backward runs on the unwrapped model), which also
        serves a rank whose rows are all empty."""
        cfg = self.config
        distributed = is_distributed()
        sharded = distributed and cfg.parallelism == "fsdp2"
        by_hand = distributed and not sharded
        policy = unwrap(self.policy) if by_hand else self.policy
        critic = None if self.critic is None else (
            unwrap(self.critic) if by_hand else self.critic)
        local_units = self._units(data["loss_mask"][rows])
        total_units = self._sum_over_ranks(local_units, {})[0] if distributed else local_units
        # FSDP2 averages gradients over ranks; scaling by the rank count makes that a sum.
        scale = float(torch.distributed.get_world_size()) if sharded else 1.0
        sums: dict[str, float] = {}
        if total_units > 0:
            for micro in self._micro_batches(data, torch.arange(rows.start, rows.stop)):
                units = self._units(micro["loss_mask"])
                # FSDP2 ranks must run the same forwards (they gather parameters together).
                if units == 0 and not sharded:
                    continue
                loss, metrics = self._micro_loss(micro, policy=policy, critic=critic)
                (loss * (units * scale / total_units)).backward()
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value * units
        if by_hand:
            self._all_reduce_gradients()
        if distributed:
            sums = self._sum_over_ranks(0.0, sums)[1]
        result = {key: value / total_units for key, value in sums.items()} if total_units else {}
        if total_units > 0:
            result.update(self._clip_gradients())
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        return result

    def _clip_gradients(self) -> dict[str, float]:
        """Clip the policy's gradient to ``max_grad_norm`` and the critic's to
        ``critic_max_grad_norm``, each by its own norm; returns the norms before clipping
        (``grad_norm``, ``critic_grad_norm``) of those clipped."""
        cfg = self.config
        limits = [("grad_norm", cfg.max_grad_norm), ("critic_grad_norm", cfg.critic_max_grad_norm)]
        norms: dict[str, float] = {}
        for (key, limit), group in zip(limits, self.optimizer.param_groups, strict=False):
            if limit is not None:
                norm = torch.nn.utils.clip_grad_norm_(group["params"], limit)
                norms[key] = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        return norms

    def _micro_batches(self, data: dict[str, torch.Tensor],
                       rows: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """`rows` of `data` in micro-batches of at most ``micro_batch_size`` rows, longest
        responses first, each cut to the prompt and response columns its rows use."""
        ordered = self._longest_first(data, rows)
        size = self.config.micro_batch_size
        return [_rows_without_padding(data, ordered[i:i + size])
                for i in range(0, len(ordered), size)]

    @staticmethod
    def _longest_first(data: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """`rows` ordered by response length, longest first (the order `_micro_batches`
        cuts them in)."""
        # Sorted on the host: `rows` are CPU indices, the data may sit on a GPU.
        lengths = data["response_mask"][rows].sum(dim=-1).cpu()
        return rows[torch.argsort(lengths, descending=True, stable=True)]

    def _micro_loss(
        self, data: dict[str, torch.Tensor], *, policy: nn.Module | None = None,
        critic: nn.Module | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss and metrics of one micro-batch (every row of `data`), computed with `policy`
        and `critic` (default: the modules as wrapped for data parallelism)."""
        policy = policy if policy is not None else self.policy
        with compute_precision(self.config.precision, self.device), \
                attention_kernel(policy, self._training_attention()):
            log_probs, entropy = response_log_probs_and_entropy(
                policy, prompt_ids=data["prompt_ids"],
                prompt_mask=data["prompt_mask"], response_ids=data["response_ids"],
                response_mask=data["response_mask"], temperature=self.config.temperature,
                padding_free=self.config.padding_free)
        return self._loss_terms(data, log_probs, entropy, critic=critic)

    def _training_attention(self) -> str | None:
        """The attention kernel of every forward of the trained models (None: the model's
        own; `ActorConfig.attention`)."""
        return training_attention(self.config.attention, precision=self.config.precision,
                                  device=self.device)

    def _loss_terms(
        self, data: dict[str, torch.Tensor], log_probs: torch.Tensor, entropy: torch.Tensor,
        *, critic: nn.Module | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss and metrics of one micro-batch from its response tokens' ``[B, R]``
        log-probs and entropies under the policy being trained: `_policy_terms`, plus PPO's
        `_value_terms` from `critic` (default: the actor's own)."""
        loss, metrics = self._policy_terms(data, log_probs, entropy)
        if self.critic is not None:
            value, value_metrics = self._value_terms(
                data, self._values(data, slice(None), critic=critic))
            loss = loss + value
            metrics.update(value_metrics)
        return loss, metrics

    def _policy_terms(
        self, data: dict[str, torch.Tensor], log_probs: torch.Tensor, entropy: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The policy-gradient, entropy and KL terms of one micro-batch and their metrics
        (whichever backend computed the log-probs)."""
        cfg = self.config
        mask = data["loss_mask"]
        if "old_log_probs" not in data:
            # A single update (`ActorConfig.single_update`): pi_old is this forward's policy.
            old = log_probs.detach()
            data = {**data, "old_log_probs": old, "rollout_weights": rollout_correction_weights(
                old, data["rollout_log_probs"], cap=cfg.rollout_correction_cap or 0.0)}
        surrogate = ppo_policy_loss(
            log_probs, data["old_log_probs"], data["advantages"], mask,
            clip_ratio=cfg.clip_ratio, clip_ratio_high=cfg.clip_ratio_high,
            dual_clip=cfg.dual_clip, aggregation=self._agg,
            token_weights=data.get("rollout_weights"))
        loss = surrogate.loss
        metrics = {"policy_loss": _scalar(surrogate.loss),
                   "clip_fraction": _scalar(surrogate.clip_fraction),
                   "approx_kl": _scalar(surrogate.approx_kl),
                   # aggregated like the loss, so streamed and whole-batch training agree
                   "advantage_mean": _scalar(aggregate_loss(data["advantages"], mask,
                                                            mode=self._agg))}
        if cfg.dual_clip is not None:
            metrics["dual_clip_fraction"] = _scalar(surrogate.dual_clip_fraction)
        if "rollout_weights" in data:
            metrics["rollout_correction_weight"] = _scalar(
                aggregate_loss(data["rollout_weights"], mask, mode=self._agg))
        entropy_loss = aggregate_loss(entropy, mask, mode=self._agg)
        metrics["entropy"] = _scalar(entropy_loss)
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * entropy_loss
        if cfg.kl_loss:
            kl = aggregate_loss(kl_penalty(log_probs, data["ref_log_probs"],
                                           estimator=cfg.kl_estimator), mask, mode=self._agg)
            loss = loss + cfg.kl_coef * kl
            metrics["kl"] = _scalar(kl)
        return loss, metrics

    def _value_terms(self, data: dict[str, torch.Tensor],
                     values: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """PPO's value term of one micro-batch from the critic's ``[B, R]`` `values`
        (weighed by ``value_coef``) and its metrics (whichever backend computed them)."""
        cfg = self.config
        vl = value_loss(values, data["old_values"], data["returns"], data["loss_mask"],
                        clip_range=cfg.value_clip, aggregation=self._agg)
        return cfg.value_coef * vl.loss, {"value_loss": _scalar(vl.loss),
                                          "value_clip_fraction": _scalar(vl.clip_fraction)}

    # -- what a role hands in and asks for ---------------------------------------------------

    def training_batch(self, shard: RolloutBatch, *, pad_token_id: int) -> RolloutBatch:
        """The rows this rank trains on, given the `shard` a flow delivered to it: the shard
        itself (each data-parallel rank trains its own). Every rank calls it (backends whose
        ranks share rows gather them here)."""
        return shard

    def response_log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, R]`` log-probs of `batch`'s responses under the current weights, at the
        training precision, on the host (no gradient)."""
        dev = self.device
        with torch.no_grad(), compute_precision(self.config.precision, dev), \
                attention_kernel(self.model, self._training_attention()):
            return response_log_probs(
                self.model, prompt_ids=batch.prompt_ids.to(dev),
                prompt_mask=batch.prompt_mask.to(dev), response_ids=batch.response_ids.to(dev),
                response_mask=batch.response_mask.to(dev),
                temperature=self.config.temperature,
                padding_free=self.config.padding_free).float().cpu()

    def response_values(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, R]`` the critic's values of `batch`'s response tokens (0 at padding), at the
        training precision, on the host (no gradient; PPO only)."""
        data = {name: getattr(batch, name).to(self.device) for name in (
            "prompt_ids", "prompt_mask", "response_ids", "response_mask")}
        with torch.no_grad():  # every backend's critic reads 0 at padding
            return self._values(data, slice(None)).float().cpu()

    # -- weights for the rollout -----------------------------------------------------------

    def state_dict_for_rollout(self, *, bucket_bytes: int = 64 << 20,
                               adapters_only: bool = False) -> Iterator[Bucket]:
        """The policy's parameters as ``(name, tensor)`` buckets of at most `bucket_bytes`,
        named as the unwrapped model's ``state_dict`` (FSDP2 shards are gathered: call it on
        every rank); with LoRA, the base model's weights with the adapters merged in, or
        with `adapters_only` the adapters alone (a receiver merges them: `AdapterTarget`)."""
        model = unwrap(self.policy)
        if adapters_only and not is_lora_model(model):
            raise ConfigError("adapters_only sends LoRA adapters; this policy has none "
                              "(ActorConfig.lora)")
        tensors = (adapter_named_tensors(model) if adapters_only
                   else merged_named_tensors(model) if is_lora_model(model)
                   else full_named_tensors(self.policy))
        return iter_buckets(tensors, bucket_bytes=bucket_bytes)

    @property
    def model(self) -> nn.Module:
        """The unwrapped policy model."""
        return unwrap(self.policy)

    # -- checkpoints -----------------------------------------------------------------------

    def save_checkpoint(self, directory: str) -> None:
        """Write model, critic, optimizer, RNG states, step and the KL reward coefficient of
        this rank to `directory`."""
        ckpt.save(directory, modules=self._modules(), optimizer=self.optimizer,
                  step=self.global_step, extra=self._extra_state())

    def load_checkpoint(self, directory: str) -> None:
        """Restore what `save_checkpoint` wrote (same config; any world size: ranks the
        checkpoint has no file for read a replica's)."""
        # Ranks hold identical, unsharded state: a relaunch on more ranks reads a replica's.
        saved = ckpt.read_rank_file(directory, any_replica=True)
        self.global_step = ckpt.restore(saved, modules=self._modules(),
                                        optimizer=self.optimizer)
        self._load_extra_state(saved.get("extra") or {})

    def _extra_state(self) -> dict[str, float]:
        """Training state outside modules and optimizer: the KL reward coefficient."""
        if self.kl_controller is None:
            return {}
        return {_KL_COEF_KEY: self.kl_controller.value}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        """Apply `_extra_state` (a checkpoint without it keeps the configured start)."""
        if self.kl_controller is not None and _KL_COEF_KEY in state:
            self.kl_controller.value = float(state[_KL_COEF_KEY])

    def _modules(self) -> nn.ModuleDict:
        modules = nn.ModuleDict({"policy": unwrap(self.policy)})
        if self.critic is not None:
            modules["critic"] = unwrap(self.critic)
        return modules

    def snapshot(self) -> dict[str, Any]:
        """A deep copy of the trainable state (modules, optimizer, step) in memory."""
        import copy

        return {"modules": copy.deepcopy(self._modules().state_dict()),
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "step": self.global_step, "extra": self._extra_state()}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Return to a `snapshot` (e.g. after a profiling run that must leave no trace)."""
        self._modules().load_state_dict(snapshot["modules"])
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.global_step = int(snapshot["step"])
        self._load_extra_state(snapshot.get("extra", {}))

    # -- offload / onload ------------------------------------------------------------------

    def offload(self) -> None:
        """Move parameters, gradients and optimizer state to host memory (no-op on CPU)."""
        if self.device.type == "cpu":
            return
        for module in self._modules().values():
            move_module(module, "cpu")
        move_optimizer_state(self.optimizer, "cpu")
        empty_device_cache(self.device)

    def onload(self) -> None:
        """Bring parameters and optimizer state back to the training device."""
        if self.device.type == "cpu":
            return
        for module in self._modules().values():
            move_module(module, self.device)
        move_optimizer_state(self.optimizer, self.device)


_PROMPT_ALIGNED = ("prompt_ids", "prompt_mask")
"""`PolicyTrainer._prepare` tensors laid out like the left-padded prompts; every other
two-dimensional one is laid out like the right-padded responses."""


def _rows_without_padding(data: dict[str, torch.Tensor],
                          rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """`rows` of every tensor of `data`, without the leading prompt columns and trailing
    response columns that are padding in all of those rows (the model sees the same tokens
    at the same positions, which restart at each row's first valid token)."""
    # At least one column each: an all-empty micro-batch still runs (FSDP2 ranks must).
    prompt_used = data["prompt_mask"][rows].any(dim=0).nonzero()
    first = int(prompt_used[0]) if len(prompt_used) else data["prompt_mask"].shape[1] - 1
    response_used = data["response_mask"][rows].any(dim=0).nonzero()
    width = int(response_used[-1]) + 1 if len(response_used) else 1
    out: dict[str, torch.Tensor] = {}
    for name, tensor in data.items():
        picked = tensor[rows]
        if picked.dim() == 2:
            picked = picked[:, first:] if name in _PROMPT_ALIGNED else picked[:, :width]
        out[name] = picked
    return out


def _scalar(value: torch.Tensor) -> float:
    return float(value.detach())
