"""`flow_spec`: the `FlowSpec` the macro flow runs, built from a `ReasoningConfig`."""

from __future__ import annotations

from pathlib import Path

from rlinf.workers.actor import ActorConfig
from rlinf.workers.models import TinyLMConfig
from rlinf.workers.reward import RewardConfig
from rlinf.workers.rollout import RolloutWorkerConfig, SamplingConfig
from rlinf_reasoning.config import ReasoningConfig
from rlinf_reasoning.flow import FlowSpec
from rlinf_reasoning.warmstart import WARMSTART_DIR

__all__ = ["flow_spec"]


def flow_spec(cfg: ReasoningConfig) -> FlowSpec:
    """Every setting of `cfg` the flow needs, in the flow's and the workers' own configs."""
    algo = cfg.algorithm
    model = cfg.model
    sampling = SamplingConfig(max_new_tokens=cfg.rollout.max_new_tokens,
                              temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                              top_k=cfg.rollout.top_k)
    actor = ActorConfig(
        algorithm=algo.name, parallelism="ddp", lr=algo.lr, weight_decay=algo.weight_decay,
        max_grad_norm=algo.max_grad_norm, mini_batch_size=algo.mini_batch_size,
        micro_batch_size=algo.micro_batch_size, epochs=algo.epochs, clip_ratio=algo.clip_ratio,
        clip_ratio_high=algo.clip_ratio_high, aggregation=algo.aggregation,
        kl_coef=algo.kl_coef, kl_estimator=algo.kl_estimator, entropy_coef=algo.entropy_coef,
        temperature=sampling.logprob_temperature, grpo_normalize_std=algo.grpo_normalize_std,
        gamma=algo.gamma, lam=algo.lam, value_coef=algo.value_coef, value_clip=algo.value_clip,
        whiten_advantages=algo.whiten_advantages, precision=model.precision)
    tiny = TinyLMConfig(hidden_size=model.hidden_size, num_layers=model.num_layers,
                        num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                        intermediate_size=model.intermediate_size) if model.from_scratch else None
    return FlowSpec(
        model_dir=Path(model.dir).expanduser() if model.dir is not None else WARMSTART_DIR,
        model_config=tiny,
        rollout=RolloutWorkerConfig(group_size=cfg.rollout.group_size,
                                    groups_per_micro_batch=cfg.rollout.groups_per_micro_batch,
                                    sampling=sampling, template=cfg.data.template),
        engine=cfg.rollout.engine,
        reward=RewardConfig(),
        actor=actor,
        recompute_logprobs=algo.recompute_logprobs,
        weight_sync=cfg.run.weight_sync,
        seed=cfg.run.seed,
        device=cfg.cluster.device,
        prompts_per_step=cfg.data.prompts_per_step,
        model_seed=cfg.run.seed,
    )
