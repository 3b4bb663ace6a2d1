"""Embodied PPO throughput: RLinf (collocated, hybrid-pipelined, `auto`) vs Stable-Baselines3.

Setting (stated in the output): a gymnasium MuJoCo task, N envs in 2 stage groups, an MLP
actor-critic (separate policy and value MLPs of two tanh layers, as SB3's ``MlpPolicy``)
whose width is calibrated so that one policy forward of a stage group costs about one env
step of that group — simulation and inference cost the same, the case where pipelining
them can pay most (ideally 2x). Every contender runs PPO with the same envs, rollout length
(``n_steps``), epochs, minibatch count and network.

Contenders, in one run (each: `--warmup` untimed iterations, then `--iterations` timed;
medians; an iteration is rollout + update + weight sync):

- ``collocated``: env and policy take turns in one process on device 0, actor on device 0;
- ``hybrid``: env process on device 0 and policy process on device 1, stage groups
  pipelined over rlinf.comm point-to-point messages; the actor on devices 0-1;
- ``auto``: `EmbodiedFlow.measure` → `rlinf.sched.fit_profile` → `rlinf.sched.plan` over
  the 2 CPU devices → launch the chosen plan (placement and stage groups);
- SB3 PPO with ``DummyVecEnv`` and with ``SubprocVecEnv`` (fork; one process per env),
  each with torch's default threads (one per core) and with one thread; the fastest of the
  four is the baseline.

The profile (`EmbodiedFlow.measure` on the hybrid flow: env steps, policy forwards and actor
updates at several batch sizes, plus round trips of stage-group messages between the env and
policy processes, which `link_cluster` fits to the link's latency per message and bandwidth)
is fitted once; for every rlinf mode the planner's simulator prices the same plan with it,
and the predicted and measured seconds per iteration stand side by side. The last line is one JSON
object: ``hybrid_speedup_vs_collocated``, ``speedup_vs_sb3`` (best rlinf mode over the
faster SB3 vector env, env steps/s), ``max_prediction_error`` (largest |predicted -
measured| / measured), and details.

Launch: ``tox -e bench-embodied`` (full setting) or ``tox -e bench-embodied -- --quick``.
``--device cuda`` (`main_cuda`) puts every contender's policy and updates on one GPU, the
simulators on CPU cores: collocated, hybrid and SB3 (``device="cuda"``), no planner.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray starts its workers at nice 15; SB3 and the profile run in this process at nice 0. On a
# machine shared with other work that alone gave the Ray workers far less CPU (predictions
# from the driver-side profile came out ~37% low). Every contender runs at nice 0.
os.environ.setdefault("RAY_worker_niceness", "0")

import numpy as np
import torch
from rlinf_embodied.flow import EmbodiedFlow
from rlinf_embodied.planning import link_cluster
from rlinf_embodied.workflow import EmbodiedSpec, embodied_workflow, fixed_plan

from rlinf.comm import Batch
from rlinf.sched import Cluster, ExecutionPlan, fit_profile, plan, simulate
from rlinf.workers.embodied.actor import EmbodiedActorConfig
from rlinf.workers.embodied.rollout import PolicyRolloutConfig, PolicyRolloutWorker
from rlinf.workers.env import EnvWorker, EnvWorkerConfig
from rlinf.workers.models.policy import PolicyConfig
from rlinf.workers.runtime import WorkerContext

CONTEXT = WorkerContext(role="bench", rank=0, world_size=1)
WIDTHS = (32, 64, 128, 192, 256, 384, 512, 768, 1024)
# A GPU forward of an MLP costs a few kernel launches and copies, below an env step at any
# width whose orthogonal init on the CPU takes seconds: the calibration takes the closest
# width up to 4096 (8192 would take minutes of init per model).
CUDA_WIDTHS = (256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class Setting:
    """What every contender trains."""

    env: str
    num_envs: int
    stages: int
    rollout_steps: int
    epochs: int
    minibatches: int
    hidden: int
    env_step_s: float
    infer_s: float
    device: Literal["cpu", "cuda"] = "cpu"
    env_threads: int = 1


def _median_time(call: Any, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def calibrate(env_name: str, num_envs: int, stages: int, *, repeats: int,
              device: Literal["cpu", "cuda"] = "cpu") -> tuple[int, float, float]:
    """Width whose stage-group forward (`PolicyRolloutWorker.infer` on `device`) best
    matches one env step of a stage group; returns (width, env step seconds, inference
    seconds)."""
    torch.set_num_threads(1)
    group = num_envs // stages
    worker = EnvWorker(CONTEXT, config=EnvWorkerConfig(env_name, num_envs=group, seed=0))
    try:
        view = worker.groups[0]
        obs = np.asarray(view.reset(seed=0)[0])
        space = worker.action_space
        space.seed(0)
        actions = np.stack([space.sample() for _ in range(group)])
        step_s = _median_time(lambda: view.step(actions), repeats)
        obs_dim, act_dim = obs.shape[1], int(np.prod(space.shape or ()))
    finally:
        worker.shutdown()
    batch = Batch({"obs": obs.astype(np.float32), "final_obs": obs.astype(np.float32),
                   "final_mask": np.zeros(group, bool), "env_index": np.arange(group)})
    best: tuple[float, int, float] | None = None
    for width in CUDA_WIDTHS if device == "cuda" else WIDTHS:
        policy = PolicyRolloutWorker(CONTEXT, config=PolicyRolloutConfig(
            policy=PolicyConfig(obs_shape=(obs_dim,), action_dim=act_dim,
                                hidden_sizes=(width, width)), num_threads=1, device=device))
        infer_s = _median_time(lambda p=policy: p.infer(batch), repeats)  # infer syncs
        gap = abs(math.log(infer_s / step_s))
        if best is None or gap < best[0]:
            best = (gap, width, infer_s)
        del policy
    assert best is not None
    return best[1], step_s, best[2]


def make_spec(s: Setting, *, obs_dim: int, act_dim: int) -> EmbodiedSpec:
    return EmbodiedSpec(
        env=EnvWorkerConfig(s.env, num_envs=s.num_envs, pipeline_stages=s.stages, seed=0,
                            threads=s.env_threads),
        policy=PolicyConfig(obs_shape=(obs_dim,), action_dim=act_dim,
                            hidden_sizes=(s.hidden, s.hidden)),
        actor=EmbodiedActorConfig(epochs=s.epochs, num_minibatches=s.minibatches),
        rollout_steps=s.rollout_steps, seed=0, device=s.device)


def build_setting(args: argparse.Namespace, device: Literal["cpu", "cuda"]
                  ) -> tuple[Setting, EmbodiedSpec]:
    """The command line's setting, its width calibrated on `device` unless ``--hidden``
    names one, and the spec every rlinf contender runs."""
    num_envs, stages = args.num_envs or 64, 2
    hidden, step_s, infer_s = calibrate(args.env, num_envs, stages, repeats=20, device=device)
    rollout_steps = args.rollout_steps or (32 if args.quick else 64)
    if args.minibatch_size:
        args.minibatches = max(1, num_envs * rollout_steps // args.minibatch_size)
    setting = Setting(args.env, num_envs, stages, rollout_steps, args.epochs,
                      args.minibatches, args.hidden or hidden, step_s, infer_s, device=device,
                      env_threads=args.env_threads)
    probe = EnvWorker(CONTEXT, config=EnvWorkerConfig(args.env, num_envs=1))
    obs_dim = int(np.prod(probe.observation_space.shape or ()))
    act_dim = int(np.prod(probe.action_space.shape or ()))
    probe.shutdown()
    return setting, make_spec(setting, obs_dim=obs_dim, act_dim=act_dim)


def timing_of(args: argparse.Namespace) -> tuple[int, int]:
    """(warm-up, timed) iterations of every contender."""
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    return warmup, args.iterations or (3 if args.quick else 7)


BREAKDOWN = ("rollout_seconds", "train_seconds", "sync_seconds", "env_step_seconds",
             "env_wait_seconds")


def time_flow(flow: EmbodiedFlow, *, warmup: int, iterations: int) -> dict[str, float]:
    """Medians over the timed iterations: seconds per iteration and where they went."""
    for step in range(warmup):
        flow.step(step)
    results = [flow.step(warmup + i) for i in range(iterations)]
    out = {"seconds": statistics.median(r.seconds for r in results)}
    for key in BREAKDOWN:
        out[key] = statistics.median(r.metrics[key] for r in results)
    return out


def predict(spec: EmbodiedSpec, chosen: ExecutionPlan, cost: Any, cluster: Cluster) -> float:
    result = simulate(embodied_workflow(spec), chosen.placement, cost, cluster,
                      micro_batch=dict(chosen.micro_batch))
    return float(result.iteration_time)


def run_sb3(s: Setting, vec: str, *, warmup: int, iterations: int,
            threads: int) -> list[float]:
    """Seconds per PPO iteration (collect n_steps from every env + update) of SB3 with
    `threads` torch intra-op threads."""
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    class Clock(BaseCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.starts: list[float] = []

        def _on_rollout_start(self) -> None:
            self.starts.append(time.perf_counter())

        def _on_step(self) -> bool:
            return True

    makers = [lambda: gym.make(s.env) for _ in range(s.num_envs)]
    env = DummyVecEnv(makers) if vec == "dummy" else SubprocVecEnv(makers, start_method="fork")
    try:
        torch.set_num_threads(threads)
        model = PPO("MlpPolicy", env, n_steps=s.rollout_steps,
                    batch_size=s.num_envs * s.rollout_steps // s.minibatches,
                    n_epochs=s.epochs, seed=0, device=s.device, verbose=0,
                    policy_kwargs={"net_arch": {"pi": [s.hidden] * 2, "vf": [s.hidden] * 2}})
        clock = Clock()
        total = warmup + iterations + 1  # the last start closes the last timed iteration
        model.learn(total_timesteps=s.num_envs * s.rollout_steps * total, callback=clock)
        clock.starts.append(time.perf_counter())
    finally:
        env.close()
    gaps = np.diff(clock.starts)
    return [float(g) for g in gaps[warmup:warmup + iterations]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small setting, few iterations")
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=None)
    parser.add_argument("--rollout-steps", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--minibatches", type=int, default=2)
    parser.add_argument("--minibatch-size", type=int, default=None,
                        help="samples per minibatch (overrides --minibatches: the rollout's "
                             "samples divided by it)")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--hidden", "--width", dest="hidden", type=int, default=None,
                        help="MLP width (default: calibrated, forward of a group = env step)")
    parser.add_argument("--skip-sb3-subproc", action="store_true")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where policies and updates compute (every contender); cuda "
                             "runs collocated, hybrid and SB3, with no planner predictions")
    parser.add_argument("--env-threads", type=int, default=1,
                        help="threads stepping a batched MuJoCo env's physics (rlinf)")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        return main_cuda(args)
    import ray

    warmup, iterations = timing_of(args)
    repeats = 3 if args.quick else 7
    setting, spec = build_setting(args, "cpu")
    num_envs, stages, rollout_steps = setting.num_envs, setting.stages, setting.rollout_steps
    hidden, step_s, infer_s = setting.hidden, setting.env_step_s, setting.infer_s
    print(f"# setting: {args.env}, {num_envs} envs in {stages} stage groups of "
          f"{num_envs // stages}, rollout {rollout_steps} steps, PPO {args.epochs} epochs x "
          f"{args.minibatches} minibatches, MLP {hidden}x{hidden} (policy and value)")
    print(f"# calibration: env step of a group {step_s * 1e3:.2f} ms, policy forward of a "
          f"group {infer_s * 1e3:.2f} ms (ratio {infer_s / step_s:.2f})")
    print(f"# load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; medians of "
          f"{iterations} iterations after {warmup} warm-up", flush=True)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    cluster = Cluster.discover(use_ray=False, cpu_slots=2)
    rows: dict[str, dict[str, Any]] = {}
    plans: dict[str, ExecutionPlan] = {}
    try:
        for mode in ("collocated", "hybrid"):
            plans[mode] = fixed_plan(spec, mode)
            with EmbodiedFlow.launch(spec, plans[mode]) as flow:
                rows[mode] = {"plan": plans[mode].spec,
                              **time_flow(flow, warmup=warmup, iterations=iterations)}
                if mode == "hybrid":  # profile once; this flow also has a link to measure
                    sizes = [num_envs // 4, num_envs // 2, num_envs]
                    profile = flow.measure(batch_sizes=sizes, repeats=repeats)
            print(f"# {mode}: {rows[mode]}", flush=True)
        cost = fit_profile(profile)
        cluster = link_cluster(cluster, embodied_workflow(spec), profile)
        link = [m.seconds for m in profile.measurements if m.component == "link"]
        print(f"# profile: link round trip of a stage group {np.median(link) * 1e3:.2f} ms; "
              f"fitted env/rollout/actor curves from {len(profile.measurements)} points",
              flush=True)
        for mode in ("collocated", "hybrid"):
            rows[mode]["predicted"] = predict(spec, plans[mode], cost, cluster)
        # Each link message costs the fitted latency, so smaller stage groups are no longer
        # free to the planner (before latency was modelled it split the envs into 16 groups
        # of 4, 2x slower, and the search had to be capped by hand).
        planned = plan(embodied_workflow(spec), cost, cluster).best
        with EmbodiedFlow.launch(spec, planned) as flow:
            timing = time_flow(flow, warmup=warmup, iterations=iterations)
        rows["auto"] = {"plan": f"{planned.spec} /{num_envs // planned.micro_batch['env']}",
                        **timing, "predicted": predict(spec, planned, cost, cluster)}
        print(f"# auto: {rows['auto']}", flush=True)
    finally:
        ray.shutdown()

    samples = num_envs * rollout_steps
    # SB3 as a user runs it: torch's default threads (one per core: its policy forwards and
    # updates use both cores) and one thread; each vector env keeps its faster setting.
    sb3: dict[str, float] = {}
    sb3_threads: dict[str, int] = {}
    for vec in ("dummy", "subproc"):
        if vec == "subproc" and args.skip_sb3_subproc:
            continue
        for threads in dict.fromkeys((os.cpu_count() or 1, 1)):
            seconds = statistics.median(run_sb3(setting, vec, warmup=warmup,
                                                iterations=iterations, threads=threads))
            print(f"# sb3 {vec}, {threads} threads: {seconds:.3f} s/iteration", flush=True)
            if seconds < sb3.get(vec, math.inf):
                sb3[vec], sb3_threads[vec] = seconds, threads

    print()
    print("plan: placement /stage groups; s/iter: measured median (rollout, train, weight sync:")
    print("their medians; env: time in env.step, wait: env waiting for actions); pred: simulated")
    print(f"{'contender':<17} {'plan':<34} {'s/iter':>7} {'pred':>7} {'err':>6} "
          f"{'steps/s':>8} {'rollout':>8} {'env':>6} {'wait':>6} {'train':>6} {'sync':>6}")
    errors = []
    for mode, row in rows.items():
        err = abs(row["predicted"] - row["seconds"]) / row["seconds"]
        errors.append(err)
        plan_text = row["plan"] if mode == "auto" else f"{row['plan']} /{stages}"
        print(f"rlinf {mode:<11} {plan_text:<34} {row['seconds']:>7.3f} "
              f"{row['predicted']:>7.3f} {err:>6.1%} {samples / row['seconds']:>8.0f} "
              f"{row['rollout_seconds']:>8.3f} {row['env_step_seconds']:>6.3f} "
              f"{row['env_wait_seconds']:>6.3f} {row['train_seconds']:>6.3f} "
              f"{row['sync_seconds']:>6.3f}")
    for vec, seconds in sb3.items():
        where = ("one process" if vec == "dummy" else "one process per env (fork)") + (
            f", {sb3_threads[vec]} thr")
        print(f"sb3 {vec + 'VecEnv':<13} {where:<34} {seconds:>7.3f} {'':>7} {'':>6} "
              f"{samples / seconds:>8.0f}")
    best_mode = min(rows, key=lambda m: rows[m]["seconds"])
    best_sb3 = min(sb3, key=lambda v: sb3[v])
    summary = {
        "hybrid_speedup_vs_collocated": rows["collocated"]["seconds"] / rows["hybrid"]["seconds"],
        "speedup_vs_sb3": sb3[best_sb3] / rows[best_mode]["seconds"],
        "max_prediction_error": max(errors),
        "best_mode": best_mode, "sb3_vec_env": best_sb3, "sb3_threads": sb3_threads[best_sb3],
        "env_steps_per_s": {m: samples / r["seconds"] for m, r in rows.items()}
        | {f"sb3_{v}": samples / t for v, t in sb3.items()},
        "predicted_s": {m: r["predicted"] for m, r in rows.items()},
        "measured_s": {m: r["seconds"] for m, r in rows.items()},
        "breakdown_s": {m: {k: r[k] for k in BREAKDOWN} for m, r in rows.items()},
        "auto_plan": rows["auto"]["plan"],
        "setting": {"env": args.env, "num_envs": num_envs, "stages": stages,
                    "rollout_steps": rollout_steps, "epochs": args.epochs,
                    "minibatches": args.minibatches, "hidden": hidden,
                    "env_step_ms": step_s * 1e3, "infer_ms": infer_s * 1e3},
        "load_average": os.getloadavg()[0],
    }
    print(json.dumps(summary))
    return 0


def main_cuda(args: argparse.Namespace) -> int:
    """The GPU setting: policy and actor on one CUDA GPU, simulators on CPU cores; width
    calibrated on the GPU. Collocated (env then policy, in one process) vs hybrid (env
    process and GPU policy process pipelined over stage groups) vs SB3 PPO with
    ``device="cuda"``. `auto` and the planner's predictions need a profile of a GPU cluster
    and are not run here (``max_prediction_error`` is null)."""
    import ray

    warmup, iterations = timing_of(args)
    setting, spec = build_setting(args, "cuda")
    num_envs, stages, rollout_steps = setting.num_envs, setting.stages, setting.rollout_steps
    hidden, step_s, infer_s = setting.hidden, setting.env_step_s, setting.infer_s
    print(f"# setting (cuda: {torch.cuda.get_device_name()}): {args.env}, {num_envs} envs in "
          f"{stages} stage groups, rollout {rollout_steps} steps, PPO {args.epochs} epochs x "
          f"{args.minibatches} minibatches, MLP {hidden}x{hidden} (policy and value)")
    print(f"# calibration: env step of a group {step_s * 1e3:.2f} ms, GPU policy forward of a "
          f"group {infer_s * 1e3:.2f} ms (ratio {infer_s / step_s:.2f})")
    print(f"# {os.cpu_count()} cores; medians of {iterations} iterations after {warmup} "
          "warm-up", flush=True)
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    rows: dict[str, dict[str, Any]] = {}
    try:
        for mode in ("collocated", "hybrid"):
            with EmbodiedFlow.launch(spec, fixed_plan(spec, mode)) as flow:
                rows[mode] = time_flow(flow, warmup=warmup, iterations=iterations)
            print(f"# {mode}: {rows[mode]}", flush=True)
    finally:
        ray.shutdown()
    samples = num_envs * rollout_steps
    sb3: dict[int, float] = {}
    for threads in dict.fromkeys((os.cpu_count() or 1, 1)):
        sb3[threads] = statistics.median(run_sb3(setting, "dummy", warmup=warmup,
                                                 iterations=iterations, threads=threads))
        print(f"# sb3 dummy, cuda, {threads} threads: {sb3[threads]:.3f} s/iteration",
              flush=True)
    print()
    print(f"{'contender':<26} {'s/iter':>7} {'steps/s':>8} {'rollout':>8} {'env':>6} "
          f"{'wait':>6} {'train':>6} {'sync':>6}")
    for mode, row in rows.items():
        print(f"rlinf {mode:<20} {row['seconds']:>7.3f} {samples / row['seconds']:>8.0f} "
              f"{row['rollout_seconds']:>8.3f} {row['env_step_seconds']:>6.3f} "
              f"{row['env_wait_seconds']:>6.3f} {row['train_seconds']:>6.3f} "
              f"{row['sync_seconds']:>6.3f}")
    for threads, seconds in sb3.items():
        print(f"{'sb3 DummyVecEnv, ' + str(threads) + ' thr':<26} {seconds:>7.3f} "
              f"{samples / seconds:>8.0f}")
    best_mode = min(rows, key=lambda m: rows[m]["seconds"])
    best_threads = min(sb3, key=lambda t: sb3[t])
    print(json.dumps({
        "device": "cuda", "gpu": torch.cuda.get_device_name(),
        "hybrid_speedup_vs_collocated": rows["collocated"]["seconds"] / rows["hybrid"]["seconds"],
        "speedup_vs_sb3": sb3[best_threads] / rows[best_mode]["seconds"],
        "max_prediction_error": None, "best_mode": best_mode, "sb3_threads": best_threads,
        "env_steps_per_s": {m: samples / r["seconds"] for m, r in rows.items()}
        | {f"sb3_dummy_{t}thr": samples / v for t, v in sb3.items()},
        "breakdown_s": {m: {k: r[k] for k in BREAKDOWN} for m, r in rows.items()},
        "setting": {"env": args.env, "num_envs": num_envs, "stages": stages,
                    "rollout_steps": rollout_steps, "epochs": args.epochs,
                    "minibatches": args.minibatches, "hidden": hidden,
                    "env_step_ms": step_s * 1e3, "infer_ms": infer_s * 1e3},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
