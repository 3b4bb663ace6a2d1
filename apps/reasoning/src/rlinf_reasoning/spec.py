"""`flow_spec`: the `rlinf.workers.reasoning.flow_spec.FlowSpec` of a `ReasoningConfig`
(the app's Hydra config), in the flow's and the workers' own configs."""

from __future__ import annotations

import dataclasses

from rlinf.envs.tools import SandboxLimits
from rlinf.workers.actor import ActorConfig, LoraConfig
from rlinf.workers.actor.megatron import MegatronConfig
from rlinf.workers.hub import resolve_model_dir
from rlinf.workers.models import TinyLMConfig
from rlinf.workers.models.sources import ModelSource
from rlinf.workers.reasoning.flow_spec import FlowSpec
from rlinf.workers.reward import RewardConfig
from rlinf.workers.rollout import RolloutGeneratorConfig, SamplingConfig
from rlinf.workers.rollout.tool_loop import ToolLoopConfig
from rlinf.workers.runtime import HostAllocator
from rlinf_reasoning.config import ReasoningConfig
from rlinf_reasoning.warmstart import TOOLS_WARMSTART_DIR, WARMSTART_DIR

__all__ = ["FlowSpec", "flow_spec", "tool_loop_config"]


def lora_config(cfg: ReasoningConfig) -> LoraConfig | None:
    """The actor's adapters (None: full fine-tuning)."""
    lora = cfg.actor.lora
    if not lora.rank:
        return None
    return LoraConfig(rank=lora.rank, alpha=lora.alpha, target_modules=lora.target_modules,
                      dropout=lora.dropout)


def tool_loop_config(cfg: ReasoningConfig) -> ToolLoopConfig | None:
    """The rollout's tool loop (None: single-turn answers)."""
    tools = cfg.tools
    if not tools.enabled:
        return None
    limits = SandboxLimits(cpu_seconds=tools.cpu_seconds, wall_seconds=tools.wall_seconds,
                           memory_bytes=tools.memory_mb << 20)
    return ToolLoopConfig(tools=tools.names, format=tools.format, sandbox=limits,
                          max_turns=tools.max_turns,
                          max_observation_tokens=tools.max_observation_tokens,
                          parallel_calls=tools.parallel_calls)


def flow_spec(cfg: ReasoningConfig) -> FlowSpec:
    """Every setting of `cfg` the flow needs, in the flow's and the workers' own configs."""
    algo = cfg.algorithm
    model = cfg.model
    sampling = SamplingConfig(max_new_tokens=cfg.rollout.max_new_tokens,
                              temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                              top_k=cfg.rollout.top_k)
    # The algorithm section's keys are ActorConfig's where they share a name.
    shared = {f.name for f in dataclasses.fields(ActorConfig)}
    actor = ActorConfig(
        **{f.name: getattr(algo, f.name) for f in dataclasses.fields(algo) if f.name in shared},
        algorithm=algo.name, parallelism="fsdp2" if cfg.actor.backend == "fsdp2" else "ddp",
        dual_clip=algo.clip_ratio_c, temperature=sampling.logprob_temperature,
        precision=model.precision, attention=cfg.actor.attention,
        padding_free=cfg.actor.padding_free, lora=lora_config(cfg))
    tiny = TinyLMConfig(hidden_size=model.hidden_size, num_layers=model.num_layers,
                        num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                        intermediate_size=model.intermediate_size) if model.from_scratch else None
    reward = RewardConfig(functions=cfg.reward.chosen, weights=cfg.reward.weights,
                          strategies=cfg.reward.answer_strategies, verifier=cfg.reward.verifier,
                          verify_timeout=cfg.reward.verify_timeout,
                          verify_rel_tol=cfg.reward.verify_rel_tol,
                          format_penalty=cfg.reward.format_penalty)
    tools = tool_loop_config(cfg)
    shipped = TOOLS_WARMSTART_DIR if tools is not None and tools.format == "tags" \
        else WARMSTART_DIR
    return FlowSpec(
        model=ModelSource(config=tiny, seed=cfg.run.seed) if tiny is not None else ModelSource(
            resolve_model_dir(model.dir) if model.dir is not None else shipped),
        tools=tools,
        rollout=RolloutGeneratorConfig(group_size=cfg.rollout.group_size,
                                    groups_per_micro_batch=cfg.rollout.groups_per_micro_batch,
                                    sampling=sampling, template=cfg.data.template,
                                    system_prompt=cfg.data.system_prompt,
                                    problem_columns=reward.reads_problems),
        engine=cfg.rollout.engine,
        reward=reward,
        actor=actor,
        megatron=(MegatronConfig(tensor_parallel=cfg.actor.tensor_parallel,
                                 pipeline_parallel=cfg.actor.pipeline_parallel,
                                 sequence_parallel=cfg.actor.sequence_parallel,
                                 distributed_optimizer=cfg.actor.distributed_optimizer)
                  if cfg.actor.backend == "megatron" else None),
        choose_cut=cfg.actor.cut == "auto",
        recompute_logprobs=algo.recompute_logprobs,
        weight_sync=cfg.run.weight_sync,
        seed=cfg.run.seed,
        device=cfg.cluster.device,
        host_allocator=HostAllocator(cfg.cluster.host_allocator),
        prompts_per_step=cfg.data.prompts_per_step,
    )
