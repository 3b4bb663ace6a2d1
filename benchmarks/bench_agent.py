"""Side by side: RLinf's tool loop and the plain loop a user writes, on one tool workload.

The workload: the shipped tool-calling warm start (``task=math_tools``) answers generated
arithmetic by calling a tool, reading its answer and answering on, sampled at temperature
1, at most ``--max-turns`` turns of ``--new-tokens`` tokens. ``--tool calculator`` (the
default) calls the in-process calculator; ``--tool python`` makes the same call a Python
program in the sandbox (``print(12+7)``: a process of its own per call, as code tools
run; `agent_tools.calculator`), the tool cost of code agents, in the loops and the flow.

Contenders, in this one process, with the same torch threads (``--threads``, default every
core) and the same fp32 weights:

- **sequential**: the loop a user writes with transformers, one trajectory at a time:
  ``generate`` (stopping at the call's closing tag with ``stop_strings``), parse the call,
  run the tool, append its answer, ``generate`` again;
- **rlinf**: `rlinf.workers.rollout.tool_loop.ToolLoop` over the HF engine: every
  trajectory of the batch generates together, the calls of a turn run at once
  (``parallel_calls`` threads; the sandbox's processes side by side), the answers are
  appended as tokens and the trajectories still calling generate together again.

They alternate (A B A B ...) over ``--rounds`` rounds of ``--trajectories`` trajectories on
the same problems; the table has medians of trajectories/s, tool calls/s and CPU-seconds
per trajectory (this process and its reaped children: the sandbox's processes).

Then the planned placement: the whole GRPO flow with the tool loop (rollout with tools,
reward, inference, actor) is profiled as ``rlinf-reasoning placement=auto`` profiles it,
the planner picks a plan (`rlinf_reasoning.pricing.ReasoningPricing.rank`), the flow is
launched on it and ``--steps`` iterations are timed after a warm-up: ``max_prediction_error`` is
|predicted - measured| / measured of the median iteration (``--skip-flow`` leaves it out).

The last line is one JSON object: ``speedup_vs_sequential_loop`` (rlinf's trajectories/s
over sequential's), ``max_prediction_error``, ``bounds_met`` (3 and 0.15), per-contender
figures, the setting and the load average at the start and the end.

Launch: ``tox -e bench-agent`` (defaults), ``tox -e bench-agent -- --tool python
--trajectories 32`` (code-tool workload), ``-- --skip-flow`` (loops only).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent))

from quiet import wait_for_idle_cores, wait_for_quiet

TOOL_SPECS = {"calculator": "calculator", "python": "agent_tools:calculator"}
"""``tools.names`` of each ``--tool``: the built-in calculator, or the same call answered
by Python in the sandbox (`agent_tools`)."""
BOUNDS = {"speedup_vs_sequential_loop": (">=", 3.0), "max_prediction_error": ("<=", 0.15)}


@dataclass
class Tally:
    """One contender's rounds."""

    name: str
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    errors: list[int] = field(default_factory=list)
    correct: list[int] = field(default_factory=list)

    def median_rate(self, count: Sequence[int] | int) -> float:
        counts = [count] * len(self.seconds) if isinstance(count, int) else list(count)
        return statistics.median(c / s for c, s in zip(counts, self.seconds, strict=True))


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the sandbox's calls)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=64,
                        help="trajectories per round (default 64)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    parser.add_argument("--tool", choices=("calculator", "python"), default="calculator")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens per turn (32)")
    parser.add_argument("--max-turns", type=int, default=2, help="turns at most (2)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads of both contenders (default: every core)")
    parser.add_argument("--prompts", type=int, default=16,
                        help="flow: prompts per iteration (16)")
    parser.add_argument("--group-size", type=int, default=4, help="flow: group size (4)")
    parser.add_argument("--steps", type=int, default=6,
                        help="flow: timed iterations after one warm-up (6)")
    parser.add_argument("--skip-flow", action="store_true",
                        help="time the loops only (no planned-placement prediction)")
    parser.add_argument("--max-load", type=float, default=1.5)
    parser.add_argument("--load-wait", type=float, default=120.0)
    args = parser.parse_args(argv)
    for name in ("trajectories", "rounds", "new_tokens", "max_turns", "threads", "prompts",
                 "group_size", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


class Workload:
    """The model, its tokenizer, the tools and the problems both contenders run."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        from rlinf_reasoning.warmstart import TOOLS_WARMSTART_DIR, load_warmstart

        from rlinf.envs.math import GeneratorConfig, ProblemGenerator, format_prompt
        from rlinf.envs.tools import ToolCall, ToolRegistry, default_tools, load_tool

        torch.set_num_threads(args.threads)
        self.args = args
        self.model, self.tokenizer = load_warmstart(path=TOOLS_WARMSTART_DIR)
        self.model.eval()
        self.tools = default_tools() if args.tool == "calculator" else ToolRegistry(
            [load_tool(TOOL_SPECS["python"])])
        problems = ProblemGenerator(GeneratorConfig.for_level(2)).generate(
            args.trajectories, split="train")
        self.answers = [p.answer for p in problems]
        self.prompts = [format_prompt(p, template="short") for p in problems]
        self.ToolCall = ToolCall

    def tool_call(self, expression: str) -> object:
        """The call the model's ``<calculator>`` tag makes."""
        return self.ToolCall("calculator", {"expression": expression})


def run_sequential(work: Workload, seed: int) -> tuple[int, int, int]:
    """The user's loop, one trajectory at a time; (calls, errors, correct)."""
    import torch

    from rlinf.envs.math import score

    tok, model = work.tokenizer, work.model
    close = "</calculator>"
    calls = errors = correct = 0
    torch.manual_seed(seed)
    with torch.no_grad():
        for prompt, answer in zip(work.prompts, work.answers, strict=True):
            ids = tok(prompt, return_tensors="pt")["input_ids"]
            final = ""
            for turn in range(work.args.max_turns):
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     max_new_tokens=work.args.new_tokens, do_sample=True,
                                     temperature=1.0, top_k=0, top_p=1.0,
                                     eos_token_id=tok.eos_token_id,
                                     pad_token_id=tok.pad_token_id, stop_strings=[close],
                                     tokenizer=tok)
                new = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
                ids = out
                final = new
                if not new.endswith(close) or turn + 1 == work.args.max_turns:
                    break
                expression = new[new.rfind("<calculator>") + len("<calculator>"):-len(close)] \
                    if "<calculator>" in new else ""
                result = work.tools.call(work.tool_call(expression))  # type: ignore[arg-type]
                calls += 1
                errors += not result.ok
                observation = tok(f"<result>{result.observation}</result>",
                                  add_special_tokens=False, return_tensors="pt")["input_ids"]
                ids = torch.cat([ids, observation], dim=1)
            correct += int(score(final, answer, strategies=("last_number",),
                                 backend="builtin") >= 1.0)
    return calls, errors, correct


class RlinfLoop:
    """`ToolLoop` over the HF engine, built once (as a rollout worker holds it)."""

    def __init__(self, work: Workload) -> None:
        from rlinf.envs.tools import ToolRegistry
        from rlinf.workers.rollout import HFRolloutEngine
        from rlinf.workers.rollout.tool_formats import TagFormat
        from rlinf.workers.rollout.tool_loop import ToolLoop, ToolLoopConfig

        tok = work.tokenizer
        engine = HFRolloutEngine(work.model, eos_token_id=int(tok.eos_token_id),
                                 pad_token_id=int(tok.pad_token_id), offload_policy="host")
        # The model writes <calculator>; with --tool python the call runs the sandbox.
        tools = ToolRegistry([work.tools.get("calculator")])
        self.loop = ToolLoop(engine, tok, tools=tools, tool_format=TagFormat(tok, tools),
                             config=ToolLoopConfig(max_turns=work.args.max_turns))
        self.work = work

    def run(self, seed: int) -> tuple[int, int, int]:
        from rlinf.workers.reward import RewardScorer
        from rlinf.workers.rollout import RolloutBatch, SamplingConfig

        tok = self.work.tokenizer
        prompts = [tok.encode(p) for p in self.work.prompts]
        samples = self.loop.generate(prompts, sampling=SamplingConfig(
            max_new_tokens=self.work.args.new_tokens, seed=seed))
        batch = RolloutBatch.from_samples(samples, answers=self.work.answers, group_size=1,
                                          pad_token_id=int(tok.pad_token_id))
        _, stats = RewardScorer(tok).compute_rewards(batch)
        return (sum(s.tool_calls for s in samples), sum(s.tool_errors for s in samples),
                round(stats.accuracy * batch.num_rows))


def time_loops(work: Workload, args: argparse.Namespace) -> tuple[Tally, Tally]:
    ours = RlinfLoop(work)
    tallies = {"rlinf": Tally("rlinf tool loop"), "sequential": Tally("sequential loop")}
    runners = {"rlinf": ours.run, "sequential": lambda seed: run_sequential(work, seed)}
    for name, runner in runners.items():  # warm-up: first-call allocations on both paths
        runner(10_000 + len(name))
    for round_index in range(args.rounds):
        for name in ("rlinf", "sequential"):
            tally = tallies[name]
            cpu, wall = _cpu_seconds(), time.perf_counter()
            calls, errors, correct = runners[name](round_index)
            tally.seconds.append(time.perf_counter() - wall)
            tally.cpu_seconds.append(_cpu_seconds() - cpu)
            tally.calls.append(calls)
            tally.errors.append(errors)
            tally.correct.append(correct)
        print(f"round {round_index + 1}/{args.rounds}: rlinf "
              f"{tallies['rlinf'].seconds[-1]:.2f} s, sequential "
              f"{tallies['sequential'].seconds[-1]:.2f} s", flush=True)
    ours.loop.shutdown()
    return tallies["rlinf"], tallies["sequential"]


def planned_flow(args: argparse.Namespace) -> dict[str, object]:
    """Profile the tool flow, plan it, run the plan: predicted vs measured seconds."""
    import ray
    from rlinf_reasoning.cli import compose_config
    from rlinf_reasoning.config import from_omegaconf
    from rlinf_reasoning.flow import ReasoningFlow
    from rlinf_reasoning.pricing import ReasoningPricing, profile_spec
    from rlinf_reasoning.spec import flow_spec

    from rlinf.envs.math import GeneratorConfig, ProblemGenerator
    from rlinf.sched import Cluster
    from rlinf.workers.runtime.ray_session import local_system_config

    overrides = ["task=math_tools", f"data.prompts_per_step={args.prompts}",
                 f"rollout.group_size={args.group_size}",
                 f"rollout.groups_per_micro_batch={max(1, args.prompts // 4)}",
                 f"rollout.max_new_tokens={args.new_tokens}",
                 f"tools.max_turns={args.max_turns}", f"tools.names=[{TOOL_SPECS[args.tool]}]",
                 "placement=auto"]
    cfg = from_omegaconf(compose_config(overrides), num_devices=2)
    spec = flow_spec(cfg)
    generator = ProblemGenerator(GeneratorConfig.for_level(2))
    # Configured as a Ray instance a run starts itself: no idle workers, workers at nice 0.
    ray.init(num_cpus=12, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _system_config=local_system_config())
    try:
        cluster = Cluster.discover(use_ray=True, cpu_slots=2)
        rows = args.prompts * args.group_size
        profile = profile_spec(spec, cluster, batch_sizes=sorted({rows // 2, rows}),
                               problems=generator.batch,
                               granularity_groups=cfg.rollout.groups_per_micro_batch)
        choice = ReasoningPricing(spec).rank(profile, cluster)
        plan = choice.plan
        wait_for_idle_cores(0.15, 30)
        seconds: list[float] = []
        with ReasoningFlow.launch(spec.for_plan(plan), plan, problems=generator.batch,
                                  cluster=cluster) as flow:
            for step in range(args.steps + 1):
                result = flow.step(step)
                if step:
                    seconds.append(result.seconds)
    finally:
        ray.shutdown()
    measured = statistics.median(seconds)
    predicted = float(plan.predicted_time)
    return {"placement": plan.spec, "mode": plan.mode.value,
            "predicted_iteration_s": round(predicted, 3),
            "measured_iteration_s": round(measured, 3),
            "prediction_error": round(abs(predicted - measured) / measured, 3)}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cores = os.cpu_count() or 1
    load_start = wait_for_quiet(args.max_load, args.load_wait)
    if load_start > args.max_load:
        print(f"bench-agent: the 1-minute load average is {load_start:.2f} on {cores} cores, "
              f"above --max-load {args.max_load:.2f}: the figures would measure that. Run "
              "it when the machine is idle, or pass --max-load.", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    work = Workload(args)
    print(f"workload: tool-calling warm start, {args.trajectories} trajectories x up to "
          f"{args.max_turns} turns of {args.new_tokens} tokens, tool {args.tool}; "
          f"{args.threads} torch threads; {args.rounds} interleaved rounds; {cores} cores, "
          f"load {load_start:.2f}", flush=True)
    started = time.perf_counter()
    ours, plain = time_loops(work, args)
    n = args.trajectories
    rows = []
    for tally in (ours, plain):
        rows.append({
            "name": tally.name,
            "trajectories_per_s": round(tally.median_rate(n), 2),
            "tool_calls_per_s": round(tally.median_rate(tally.calls), 2),
            "cpu_s_per_trajectory": round(statistics.median(tally.cpu_seconds) / n, 4),
            "wall_s": round(statistics.median(tally.seconds), 3),
            "accuracy": round(statistics.median(tally.correct) / n, 3),
            "tool_error_rate": round(sum(tally.errors) / max(sum(tally.calls), 1), 4),
        })
    print()
    print(f"{'contender':<18} {'traj/s':>8} {'calls/s':>8} {'CPU-s/traj':>11} {'wall s':>8} "
          f"{'accuracy':>9}")
    for r in rows:
        print(f"{r['name']:<18} {r['trajectories_per_s']:>8} {r['tool_calls_per_s']:>8} "
              f"{r['cpu_s_per_trajectory']:>11} {r['wall_s']:>8} {r['accuracy']:>9}")
    speedup = rows[0]["trajectories_per_s"] / rows[1]["trajectories_per_s"]  # type: ignore[operator]
    verdict: dict[str, object] = {"speedup_vs_sequential_loop": round(speedup, 2)}
    flow = None
    if not args.skip_flow:
        print("\nprofiling, planning and running the tool flow ...", flush=True)
        flow = planned_flow(args)
        print(f"planned placement {flow['placement']} ({flow['mode']}): predicted "
              f"{flow['predicted_iteration_s']} s, measured {flow['measured_iteration_s']} s "
              f"per iteration (median)")
    verdict["max_prediction_error"] = None if flow is None else flow["prediction_error"]
    verdict["bounds_met"] = {
        key: (None if verdict[key] is None else
              (verdict[key] >= bound if op == ">=" else verdict[key] <= bound))  # type: ignore[operator]
        for key, (op, bound) in BOUNDS.items()}
    verdict["contenders"] = rows
    verdict["flow"] = flow
    verdict["setting"] = {k: getattr(args, k) for k in (
        "trajectories", "rounds", "tool", "new_tokens", "max_turns", "threads", "prompts",
        "group_size", "steps")}
    verdict["cores"] = cores
    verdict["load_average"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    verdict["wall_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
