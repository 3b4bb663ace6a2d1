"""LIBERO with camera images: env throughput against the number of env processes, and the
embodied app's placements (collocated, hybrid, ``auto``) with the planner's prediction.

Run as a mode of the embodied benchmark, ``tox -e bench-embodied -- --libero`` (or
``python benchmarks/bench_libero.py``). Two parts, each in interleaved rounds (the order of
the contenders rotates from round to round):

1. **Env steps/s.** `--num-envs` envs of one LIBERO task, random actions, agent-view and
   wrist cameras at `--image-size`, no episode ending inside the timed steps. Contenders:
   rlinf's vector env in this process (``rlinf x1``) and sharded over P processes
   (``rlinf xP``, each P of `--processes`); LIBERO's own vector envs as its users run them:
   ``SubprocVectorEnv`` (one process per env, what LIBERO's evaluation scripts use) and
   ``DummyVectorEnv`` (a loop in one process). Every contender renders the same scenes with
   the same flags (`--no-render-effects` turns shadows and reflections off for all).
   Reported: median env steps/s, CPU-seconds per 1,000 steps (this process and its
   children), and the ratios.
2. **Training.** `rlinf-embodied task=<task>` with the tiny VLA for `--iterations`
   iterations in collocated, hybrid and ``auto`` placement, each with `--app-processes`
   env processes (`bench_flow`'s runner: one shared Ray instance, the run's
   ``summary.json``): measured and predicted s/iter, ``auto``'s plan. With more than one
   env process each fixed placement also runs with ``env.concurrent_groups=false`` (every
   stage group spans all processes and the groups take turns: the older layout),
   against the default (each group in processes of its own, stepped concurrently).

The last line is one JSON object: ``env_steps_per_s`` per contender,
``process_speedup`` (best ``rlinf xP`` over ``rlinf x1``), ``speedup_vs_libero_subproc``
and ``speedup_vs_libero_dummy`` (best rlinf over LIBERO's vector envs),
``hybrid_vs_collocated`` (collocated's s/iter over hybrid's, at each process count),
``concurrent_vs_turns`` (taking turns' s/iter over concurrent groups', per placement),
``auto_vs_best_fixed``, ``max_prediction_error`` and the load average at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_flow import Setting, run_once, runtime
from flow_summary import FlowRun, format_table
from process_cpu import tree_cpu_seconds

TURNS = "-turns"
"""Suffix of an app setting whose stage groups take turns (``env.concurrent_groups=false``)."""

Stepper = tuple[Callable[[np.ndarray], Any], Callable[[], None], int]
"""A built contender: step(actions), close(), action dimension."""


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def build_rlinf(args: argparse.Namespace, processes: int) -> Stepper:
    from rlinf.envs.embodied import make_vector_env

    env = make_vector_env(f"{args.suite}/{args.task}", num_envs=args.num_envs, seed=0,
                          render_size=(args.image_size, args.image_size),
                          max_episode_steps=10_000, processes=processes,
                          env_kwargs={"render_effects": args.render_effects})
    env.reset()
    return env.step, env.close, 7


def build_libero(args: argparse.Namespace, kind: str) -> Stepper:
    """LIBERO's `SubprocVectorEnv` or `DummyVectorEnv`, one env function per env."""
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs import DummyVectorEnv, OffScreenRenderEnv, SubprocVectorEnv

    from rlinf.envs.embodied.backends.libero import disable_render_effects

    suite = benchmark.get_benchmark_dict()[args.suite](task_order_index=0)
    task = suite.get_task(args.task)
    bddl = f"{get_libero_path('bddl_files')}/{task.problem_folder}/{task.bddl_file}"
    states = suite.get_task_init_states(args.task)
    size, effects = args.image_size, args.render_effects

    def make() -> Any:
        env = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=size, camera_widths=size)
        if not effects:
            disable_render_effects(env)
        return env

    vector = (SubprocVectorEnv if kind == "subproc" else DummyVectorEnv)(
        [make for _ in range(args.num_envs)])
    vector.reset()
    vector.set_init_state([states[i % len(states)] for i in range(args.num_envs)])
    return vector.step, vector.close, 7


def time_steps(stepper: Stepper, *, num_envs: int, warmup: int, steps: int, seed: int
               ) -> tuple[float, float]:
    """(env steps/s, CPU-seconds per 1,000 env steps) over `steps` batched steps."""
    step, _, action_dim = stepper
    rng = np.random.default_rng(seed)
    for _ in range(warmup):
        step(rng.uniform(-1, 1, (num_envs, action_dim)))
    cpu, start = tree_cpu_seconds(), time.perf_counter()
    for _ in range(steps):
        step(rng.uniform(-1, 1, (num_envs, action_dim)))
    seconds, cpu = time.perf_counter() - start, tree_cpu_seconds() - cpu
    return num_envs * steps / seconds, 1000 * cpu / (num_envs * steps)


def contender_names(args: argparse.Namespace) -> list[str]:
    names = [f"rlinf x{p}" for p in args.processes]
    return names if args.no_peers else [*names, "LIBERO SubprocVectorEnv",
                                        "LIBERO DummyVectorEnv"]


def build(args: argparse.Namespace, name: str) -> Stepper:
    if name.startswith("rlinf x"):
        return build_rlinf(args, int(name.removeprefix("rlinf x")))
    return build_libero(args, "subproc" if "Subproc" in name else "dummy")


def measure_one(args: argparse.Namespace) -> int:
    """``--contender NAME``: build, time and close one contender in this fresh process (LIBERO's
    forking SubprocVectorEnv hung when built in a process that had rendered before; not
    diagnosed); print its figures as one JSON line."""
    stepper = build(args, args.contender)
    try:
        rate, cpu = time_steps(stepper, num_envs=args.num_envs, warmup=args.warmup,
                               steps=args.steps, seed=args.seed)
    finally:
        stepper[1]()
    print(json.dumps({"env_steps_per_s": rate, "cpu_s_per_1000_steps": cpu}), flush=True)
    return 0


def env_part(args: argparse.Namespace, argv: list[str]) -> dict[str, dict[str, float]]:
    names = contender_names(args)
    rates: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(args.rounds):
        k = round_index % len(names)
        for name in names[k:] + names[:k]:
            proc = subprocess.run(
                [sys.executable, __file__, *argv, "--contender", name, "--seed",
                 str(round_index)], capture_output=True, text=True, check=False,
                timeout=args.run_timeout)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            if proc.returncode != 0 or not lines:
                print(f"# round {round_index + 1} {name} failed (exit {proc.returncode}):\n#  "
                      + "\n#  ".join(proc.stderr.strip().splitlines()[-15:]), flush=True)
                continue
            figures = json.loads(lines[-1])
            rates[name].append(figures["env_steps_per_s"])
            cpus[name].append(figures["cpu_s_per_1000_steps"])
            print(f"# round {round_index + 1} {name}: {rates[name][-1]:.2f} env steps/s, "
                  f"{cpus[name][-1]:.1f} CPU-s per 1000 steps (load {_load()})", flush=True)
    return {name: {"env_steps_per_s": statistics.median(rates[name]),
                   "cpu_s_per_1000_steps": statistics.median(cpus[name])}
            for name in names if rates[name]}


APP_COMMON = ("run.eval_every=0", "run.checkpoint_every=0", "run.eval_episodes=1",
              "env.max_episode_steps=48", "run.eval_max_steps=48", "run.video=false",
              "run.trace=true", "algorithm.epochs=2", "algorithm.num_minibatches=4")
"""Every app run: one short evaluation before and after (LIBERO resets every iteration, so
48-step episodes never end inside a rollout), traced so fixed placements are priced."""


def app_part(args: argparse.Namespace) -> list[FlowRun]:
    common = (f"task={args.suite}", f"env.id=libero:{args.suite}/{args.task}",
              f"env.num_envs={args.app_envs}", f"run.rollout_steps={args.rollout_steps}",
              f"env.image_size={args.image_size}", "policy.vla.patch_size=16",
              "policy.vla.hidden_size=32", "policy.vla.num_layers=1", "policy.vla.num_heads=2",
              f"env.render_effects={str(args.render_effects).lower()}")
    settings = [Setting("embodied", f"{args.suite}-e{args.app_envs}-p{p}",
                        (*common, f"env.processes={p}")) for p in args.app_processes]
    if args.group_turns:  # the stage groups spanning every process and taking turns
        settings += [Setting("embodied", f"{args.suite}-e{args.app_envs}-p{p}{TURNS}",
                             (*common, f"env.processes={p}", "env.concurrent_groups=false"))
                     for p in args.app_processes if p > 1]
    runs: list[FlowRun] = []
    workdir = Path(tempfile.mkdtemp(prefix="bench-libero-"))
    with runtime(use_ray=True) as address:
        for round_index in range(args.rounds):
            for setting in settings:
                k = round_index % len(args.modes)
                for mode in args.modes[k:] + args.modes[:k]:
                    if setting.name.endswith(TURNS) and mode == "auto":
                        continue  # compared in fixed placements only
                    run, seconds = run_once(setting, mode, steps=0,
                                            iterations=args.iterations, ray_address=address,
                                            workdir=workdir, timeout=args.run_timeout,
                                            common=APP_COMMON)
                    runs.append(run)
                    print(f"# round {round_index + 1} {setting.name} {mode}: measured "
                          f"{run.measured} s/iter, predicted {run.predicted} ({seconds:.0f} s"
                          f" wall, load {_load()}) {run.error}", flush=True)
    return runs


def _median_runs(runs: list[FlowRun]) -> list[FlowRun]:
    """Per (setting, mode): the run of median measured time (with its own prediction)."""
    groups: dict[tuple[str, str], list[FlowRun]] = {}
    for run in runs:
        groups.setdefault((run.setting, run.mode), []).append(run)
    chosen = []
    for group in groups.values():
        ok = sorted((r for r in group if r.measured is not None), key=lambda r: r.measured or 0)
        chosen.append(ok[len(ok) // 2] if ok else group[0])
    return chosen


def verdict(envs: dict[str, dict[str, float]], runs: list[FlowRun]) -> dict[str, Any]:
    rate = {name: round(v["env_steps_per_s"], 3) for name, v in envs.items()}
    ours = {name: r for name, r in rate.items() if name.startswith("rlinf")}
    out: dict[str, Any] = {"env_steps_per_s": rate,
                           "cpu_s_per_1000_steps": {n: round(v["cpu_s_per_1000_steps"], 1)
                                                    for n, v in envs.items()}}
    best = max(ours.values()) if ours else None
    if best and "rlinf x1" in ours:
        out["process_speedup"] = round(best / ours["rlinf x1"], 3)
    for peer, key in (("LIBERO SubprocVectorEnv", "speedup_vs_libero_subproc"),
                      ("LIBERO DummyVectorEnv", "speedup_vs_libero_dummy")):
        if best and rate.get(peer):
            out[key] = round(best / rate[peer], 3)
    rows = _median_runs(runs)
    by = {(r.setting, r.mode): r for r in rows}
    settings = sorted({r.setting for r in rows})
    out["hybrid_vs_collocated"] = {
        s: round(by[(s, "collocated")].measured / by[(s, "hybrid")].measured, 3)  # type: ignore[operator]
        for s in settings if by.get((s, "collocated")) and by.get((s, "hybrid"))
        and by[(s, "collocated")].measured and by[(s, "hybrid")].measured}
    out["concurrent_vs_turns"] = {
        f"{s}/{m}": round(by[(s + TURNS, m)].measured / by[(s, m)].measured, 3)  # type: ignore[operator]
        for s in settings for m in ("collocated", "hybrid")
        if by.get((s, m)) and by.get((s + TURNS, m)) and by[(s, m)].measured
        and by[(s + TURNS, m)].measured}
    ratios = []
    for s in settings:
        fixed = [by[(s, m)].measured for m in ("collocated", "hybrid")
                 if by.get((s, m)) and by[(s, m)].measured]
        auto = by.get((s, "auto"))
        if fixed and auto and auto.measured:
            ratios.append(auto.measured / min(fixed))  # type: ignore[type-var]
            out.setdefault("auto_choice", {})[s] = auto.placement
    if ratios:
        out["auto_vs_best_fixed"] = round(max(ratios), 3)
    errors = [r.prediction_error for r in rows if r.prediction_error is not None]
    if errors:
        out["max_prediction_error"] = round(max(errors), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="libero_spatial")
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--num-envs", type=int, default=4, help="envs of the env part")
    parser.add_argument("--processes", type=int, nargs="+", default=None,
                        help="rlinf process counts of the env part (default 1 and the cores)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--no-render-effects", dest="render_effects", action="store_false",
                        help="no shadows or reflections, for every contender")
    parser.add_argument("--steps", type=int, default=30, help="timed batched env steps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-peers", action="store_true", help="leave LIBERO's envs out")
    parser.add_argument("--no-app", action="store_true", help="skip the training part")
    parser.add_argument("--no-env", action="store_true", help="skip the env steps/s part")
    parser.add_argument("--app-envs", type=int, default=4)
    parser.add_argument("--app-processes", type=int, nargs="+", default=None,
                        help="env processes of the app runs (default 1 and the cores)")
    parser.add_argument("--rollout-steps", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["collocated", "hybrid", "auto"])
    parser.add_argument("--run-timeout", type=float, default=1200.0)
    parser.add_argument("--no-group-turns", dest="group_turns", action="store_false",
                        help="skip the app runs whose stage groups take turns over all env "
                             "processes (env.concurrent_groups=false)")
    parser.add_argument("--contender", help=argparse.SUPPRESS)  # one env contender, in a child
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    args.processes = args.processes or sorted({1, min(cores, args.num_envs)})
    args.app_processes = args.app_processes or sorted({1, min(cores, args.app_envs)})
    if args.contender:
        return measure_one(args)
    load_start = _load()
    print(f"# LIBERO {args.suite}/{args.task}: {args.num_envs} envs, {args.image_size}px "
          f"cameras (render effects {args.render_effects}), {cores} cores, load {load_start}",
          flush=True)
    envs = {} if args.no_env else env_part(args, argv)
    for name, value in envs.items():
        print(f"{name:26s} {value['env_steps_per_s']:8.2f} env steps/s "
              f"{value['cpu_s_per_1000_steps']:8.1f} CPU-s/1000 steps")
    runs = [] if args.no_app else app_part(args)
    if runs:
        print(format_table(_median_runs(runs)))
    result = verdict(envs, runs)
    result["load_average"] = {"start": load_start, "end": _load()}
    result["cores"] = cores
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
