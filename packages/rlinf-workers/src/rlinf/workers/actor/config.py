"""`ActorConfig`: every option of the training worker, one docstring each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlinf.workers.actor.lora import LoraConfig
from rlinf.workers.algorithms import KLControlKind, KLEstimator, LossAggregation
from rlinf.workers.errors import ConfigError
from rlinf.workers.models.attention import AttentionChoice, check_attention
from rlinf.workers.models.precision import Precision, check_precision

__all__ = ["ActorConfig", "Algorithm", "Parallelism"]

Algorithm = Literal["grpo", "ppo"]
Parallelism = Literal["none", "ddp", "fsdp2"]


@dataclass(frozen=True)
class ActorConfig:
    """How the actor trains (GRPO or PPO with a critic)."""

    algorithm: Algorithm = "grpo"
    """"grpo": group-normalised outcome advantages; "ppo": critic + GAE."""
    parallelism: Parallelism = "ddp"
    """Data parallelism when a process group is initialised: DDP (parameters broadcast from
    rank 0 at start) or FSDP2 (fully_shard); "none" wraps nothing. Without FSDP2 gradients
    are summed over the ranks once per optimizer step."""
    lr: float = 1e-4
    """AdamW learning rate of the policy."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    max_grad_norm: float | None = 1.0
    """Clip the policy's gradient norm to this value (None: no clipping)."""
    critic_lr: float | None = None
    """PPO: the critic's AdamW learning rate (None: `lr`). The critic is a parameter group
    of its own: AdamW's moments are per parameter, so this is an optimizer of its own with
    its own rate and clip (veRL's ``critic.optim``)."""
    critic_max_grad_norm: float | None = 1.0
    """PPO: clip the critic's gradient norm to this value, apart from the policy's, so a
    large value-loss gradient never shrinks the policy's step (veRL's
    ``critic.grad_clip``; None: no clipping)."""
    mini_batch_size: int | None = None
    """Rows per optimizer step (None: the whole batch is one step)."""
    micro_batch_size: int = 8
    """Rows per forward/backward; gradients accumulate over a mini-batch's micro-batches."""
    epochs: int = 1
    """Passes over the batch per `train` call."""
    clip_ratio: float = 0.2
    """PPO ratio clip (lower side, and upper unless `clip_ratio_high`)."""
    clip_ratio_high: float | None = None
    """Separate upper ratio clip (DAPO clip-higher)."""
    dual_clip: float | None = None
    """Dual-clip PPO (veRL's ``clip_ratio_c``, 3 there): a negative-advantage token's loss is
    at most ``-dual_clip * A``, whatever its ratio (> 1; None: off)."""
    rollout_correction_cap: float | None = None
    """Truncated importance sampling against the rollout engine's sampling distribution:
    each token's loss is weighted by ``min(pi_old / pi_rollout, cap)`` (veRL's
    ``tis_imp_ratio_cap``, 2 in its examples; TRL's ``vllm_importance_sampling_mode=
    "token_truncate"`` with ``vllm_importance_sampling_clip_max``).
    pi_old is the trainer's: recomputed by an inference pass (batches that carry
    ``old_log_probs``) or, for a `single_update` config, the training forward's own
    log-probs, detached. None: off."""
    lora: LoraConfig | None = None
    """Train low-rank adapters on the policy instead of all its weights (PEFT; the extra
    lora): only the adapters train and have optimizer state, generators receive the merged
    weights. DDP or no parallelism; a PPO critic still trains in full."""
    aggregation: str = LossAggregation.TOKEN_MEAN.value
    """Loss aggregation: "token-mean", "seq-mean-token-sum" or "seq-mean-token-mean"."""
    kl_coef: float = 0.0
    """Weight of the KL to the reference (0: no reference needed): a loss term, or with
    `kl_in_reward` the reward penalty's starting coefficient."""
    kl_in_reward: bool = False
    """Subtract ``coef * kl`` from each response token's reward before advantages instead
    of adding a KL loss term (veRL's ``use_kl_in_reward``; `rlinf.workers.algorithms.
    kl_control`): the KL of the policy that sampled the batch (its old log-probs), the
    coefficient from `kl_ctrl`. GRPO sums the penalised tokens into the response's reward."""
    kl_ctrl: KLControlKind = "fixed"
    """With `kl_in_reward`: "fixed" keeps `kl_coef`; "adaptive" moves it toward `target_kl`
    once per step (veRL's ``kl_ctrl.type``)."""
    target_kl: float = 0.1
    """Adaptive KL control: the per-token KL aimed at."""
    kl_horizon: int = 10_000
    """Adaptive KL control: responses over which the coefficient moves by at most 20%."""
    kl_estimator: str = KLEstimator.LOW_VAR_KL.value
    """KL estimator, named as veRL names them: "k1"/"kl", "abs", "k2"/"mse", "k3" =
    "low-var-kl"/"low_var_kl" (clamped as veRL does), or "k3-unclamped"."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    temperature: float = 1.0
    """Rollout sampling temperature (log-probs are of the scaled distribution)."""
    grpo_normalize_std: bool = True
    """GRPO: divide by the group std (False: Dr. GRPO)."""
    gamma: float = 1.0
    """PPO: discount over response tokens."""
    lam: float = 0.95
    """PPO: GAE lambda."""
    value_coef: float = 0.5
    """PPO: weight of the value loss."""
    value_clip: float | None = 0.2
    """PPO: clip range of the value update (None: unclipped)."""
    whiten_advantages: bool = True
    """PPO: normalise advantages over the batch's valid tokens."""
    precision: Precision = "fp32"
    """Forward/backward precision: "fp32", or "bf16" autocast (parameters, gradients and
    optimizer state stay fp32). The flow gives the rollout and inference roles the same."""
    attention: AttentionChoice = "auto"
    """Attention kernel of the training forwards (`rlinf.workers.models.attention`):
    "model" (as the model was built or loaded), "eager", "sdpa", or "auto": eager in bf16
    on CPU, whose fused kernel is slow to differentiate there, else the model's own. One
    kernel for the whole run, which the inference pass recomputing the old log-probs and
    the critic's old values use too (`InferenceConfig.attention`): the same kernel gives
    the same bits, so an on-policy first step has a ratio of exactly 1."""
    padding_free: bool = True
    """Train on the micro-batch's real tokens only, packed end to end
    (`rlinf.workers.models.packing`, veRL's ``use_remove_padding``): the same loss up to
    float noise, without computing the padding of short prompts and early-stopped
    responses. A model that does not honour packed sequences trains padded (checked once,
    with a warning)."""
    policy_lag: int = 0
    """Updates the rollout lags this trainer by: 0, or 1 (a flow with ``policy_lag=1``:
    the batch was sampled with the weights before the last update). With 1 the trainer
    recomputes the old log-probs itself before updating (the proximal policy of decoupled
    PPO) and `rollout_correction_cap`, required then, truncates each token's weight
    pi_old / pi_rollout against the policy that sampled it."""

    def __post_init__(self) -> None:
        if self.algorithm not in ("grpo", "ppo"):
            raise ConfigError(f"algorithm must be 'grpo' or 'ppo', got {self.algorithm!r}")
        if self.parallelism not in ("none", "ddp", "fsdp2"):
            raise ConfigError(f"parallelism must be 'none', 'ddp' or 'fsdp2', got "
                              f"{self.parallelism!r}")
        if self.lora is not None and self.parallelism == "fsdp2":
            raise ConfigError("LoRA adapters train with parallelism 'ddp' or 'none', not "
                              "'fsdp2' (the adapters are small: data parallelism fits them)")
        if self.micro_batch_size < 1 or self.epochs < 1 or (
                self.mini_batch_size is not None and self.mini_batch_size < 1):
            raise ConfigError("micro_batch_size, mini_batch_size and epochs must be >= 1")
        if self.lr <= 0 or self.temperature <= 0:
            raise ConfigError(f"lr and temperature must be > 0, got {self.lr}, "
                              f"{self.temperature}")
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ConfigError(f"dual_clip must be > 1 (a multiple of -advantage; veRL uses 3) "
                              f"or None, got {self.dual_clip}")
        if self.critic_lr is not None and not self.critic_lr > 0:
            raise ConfigError(f"critic_lr must be > 0 or None (the policy's lr), got "
                              f"{self.critic_lr}")
        for name in ("max_grad_norm", "critic_max_grad_norm"):
            norm = getattr(self, name)
            if norm is not None and not norm > 0:
                raise ConfigError(f"{name} must be > 0 or None (no clipping), got {norm}")
        if self.kl_in_reward and not self.kl_coef > 0:
            raise ConfigError(f"kl_in_reward needs kl_coef > 0 (the penalty's starting "
                              f"coefficient), got {self.kl_coef}")
        if self.kl_ctrl not in ("fixed", "adaptive"):
            raise ConfigError(f"kl_ctrl must be 'fixed' or 'adaptive', got {self.kl_ctrl!r}")
        if not self.target_kl > 0 or self.kl_horizon < 1:
            raise ConfigError(f"target_kl must be > 0 and kl_horizon >= 1, got "
                              f"{self.target_kl} and {self.kl_horizon}")
        if self.rollout_correction_cap is not None and not self.rollout_correction_cap > 0:
            raise ConfigError(f"rollout_correction_cap must be > 0 (veRL's examples use 2) or "
                              f"None, got {self.rollout_correction_cap}")
        if self.policy_lag not in (0, 1):
            raise ConfigError(f"policy_lag must be 0 or 1, got {self.policy_lag!r}")
        if self.policy_lag and self.rollout_correction_cap is None:
            raise ConfigError("policy_lag=1 weighs each token by pi_old / pi_rollout against "
                              "the stale policy that sampled it: set rollout_correction_cap "
                              "(veRL's examples use 2)")
        LossAggregation.parse(self.aggregation)
        KLEstimator.parse(self.kl_estimator)
        check_precision(self.precision)
        check_attention(self.attention)

    @property
    def kl_loss(self) -> bool:
        """Whether the loss has a KL-to-reference term (`kl_coef` without `kl_in_reward`)."""
        return self.kl_coef > 0 and not self.kl_in_reward

    @property
    def critic_learning_rate(self) -> float:
        """The critic's learning rate (`critic_lr`, else the policy's)."""
        return self.lr if self.critic_lr is None else self.critic_lr

    @property
    def single_update(self) -> bool:
        """Whether each batch gets exactly one optimizer step from the weights that sampled
        it (one epoch, no mini-batches, no lag). Then pi_old is the policy being updated and
        its log-probs are the training forward's own, detached: no separate recompute pass
        is needed for the ratio or the rollout correction (TRL at ``num_iterations=1`` does
        the same for its ratio)."""
        return self.epochs == 1 and self.mini_batch_size is None and self.policy_lag == 0

    def can_stream(self, *, distributed: bool) -> bool:
        """Whether gradients can accumulate micro-batch by micro-batch as data arrives, with
        one optimizer step at the end (`PolicyTrainer.accumulate`): GRPO (advantages are per
        group), one epoch, one step per batch, no KL in the reward (its controller measures
        the whole batch) and no sharded (FSDP2) gradients."""
        return (self.algorithm == "grpo" and self.epochs == 1 and self.mini_batch_size is None
                and not self.kl_in_reward
                and not (distributed and self.parallelism == "fsdp2"))
