"""Embodied PPO throughput: RLinf (collocated, hybrid-pipelined, `auto`) vs Stable-Baselines3
and torchrl, and the wall time each takes to learn.

Setting (stated in the output; every flag can change it): by default the settings users run
(issue #12): HalfCheetah-v5, 16 envs in 2 stage groups, 128-step rollouts, separate policy
and value MLPs of two tanh layers (as SB3's ``MlpPolicy``) at 64x64 and then 256x256, PPO 10
epochs over minibatches of 64. ``--stress`` is the labelled stress case instead: 64 envs,
64-step rollouts, 1 epoch x 2 minibatches, and a width calibrated so that one policy forward
of a stage group costs about one env step of that group (simulation and inference cost the
same, where pipelining them can pay most, ideally 2x). Every contender runs PPO with the
same envs, rollout length (``n_steps``), epochs, minibatch count and network.

Contenders, interleaved in ``--rounds`` rounds (every contender once per round, A B C ...
A B C ...; each time `--warmup` untimed iterations, then `--iterations` timed; the figure
is the median over rounds of each round's median; an iteration is rollout + update +
weight sync). CPU-seconds per 1,000 env steps (the machine's busy time over the timed
iterations, /proc/stat) stand next to wall time, and the run is refused when the load
average is above ``--max-load``:

- ``collocated``: env and policy take turns in one process on device 0, actor on device 0;
- ``collocated_all``: every component on both devices, taking turns (issue #12's
  collocated): two env workers of half the envs each, each with its policy inline, then the
  actor on two threads (``env,rollout,actor: 0-1``; needs an even number of stage groups);
- ``hybrid``: env process on device 0 and policy process on device 1, stage groups
  pipelined over rlinf.comm point-to-point messages; the actor on devices 0-1;
- ``auto``: `EmbodiedFlow.measure` → `rlinf.sched.fit_profile` → `rlinf.sched.plan` over
  the 2 CPU devices → launch the chosen plan (placement and stage groups);
- ``lagged`` (unless ``--no-lagged``): ``algorithm.policy_lag=1`` with env and policy in one
  process on device 0 and the actor on device 1, so each rollout runs beside the update on
  the previous one (one update of policy lag, corrected by decoupled PPO). A different
  algorithm from the synchronous modes, so it stands beside them: it is not the "best mode"
  of the headline ratios (``lagged_speedup_vs_best_fixed`` is its own ratio, and its
  prediction, the planner's lagged workflow, its own ``lagged_prediction_error``); its timed
  iterations follow at least one warm-up, since the first trains nothing;
- SB3 PPO (`sb3_ppo`) with ``DummyVecEnv``, with ``SubprocVecEnv`` (fork; one process per
  env) and, when envpool is installed, with envpool's C++ vector env on every core
  (`envpool_vec_env.EnvpoolVecEnv`), each with torch's default threads (one per core) and
  with one thread;
- torchrl's PPO (`torchrl_ppo`), when torchrl is installed: its collector in the learner's
  process (both thread counts) and its multi-process collector (`MultiSyncCollector`, one
  collector process per core).

The fastest of SB3's and torchrl's configurations is the best peer.
Every contender allocates host memory alike (``--allocator``; default jemalloc keeping the
pages it frees, rlinf's workers' default, `rlinf.workers.runtime.allocator`): run from the
command line, this process, where SB3 and torchrl run, restarts itself with it preloaded.

The profile (`EmbodiedFlow.measure` on the hybrid flow: env steps, policy forwards and actor
updates at several batch sizes, plus round trips of stage-group messages between the env and
policy processes, which `link_cluster` fits to the link's latency per message and bandwidth)
is fitted once; for every rlinf mode the planner's simulator prices the same plan with it,
and the predicted and measured seconds per iteration stand side by side. The last line is one JSON
object: ``speedup_vs_best_peer_<width>`` (best rlinf mode over the fastest peer, env
steps/s), ``speedup_vs_sb3`` (over the fastest SB3 configuration, at the first width),
``hybrid_speedup_vs_collocated`` (against ``collocated_all``: all cores, so the ratio measures
pipelining; ``hybrid_speedup_vs_collocated_one_device`` against ``collocated``),
``auto_vs_best_fixed`` (the best of the fixed modes), ``max_prediction_error``
(largest |predicted - measured| / measured), CPU-seconds per 1,000 steps, and details.
Several ``--width`` values run one after another (each with its own rounds) into one
object, with the worst ``auto_vs_best_fixed`` and ``max_prediction_error`` over widths and
each width's summary under ``per_width``. User settings: ``--width 64 256 --epochs 10
--minibatch-size 64 --num-envs 16 --rollout-steps 128``.

Then a learning check, so that no throughput trick hides a learning regression: on
``--threshold-env`` (InvertedDoublePendulum-v5) at the first width's setting, rlinf's
fastest fixed mode, the fastest SB3 and the fastest torchrl configuration each train until
the episodes ended in an iteration average a return of ``--threshold`` (1000), seeds
interleaved (``--threshold-seeds``, 3), each run capped at ``--threshold-budget-s``.
``time_to_threshold_ratio`` is rlinf's median wall time (launch excluded) over the fastest
peer's; the ``lagged`` contender trains too (``lagged_time_to_threshold_ratio`` over the
fastest peer, ``lagged_vs_synchronous_time_to_threshold`` over rlinf's fixed mode), since
learning from weights one update old may take more iterations than it saves time.

Launch: ``tox -e bench-embodied`` (full setting) or ``tox -e bench-embodied -- --quick``.
``--device cuda`` (`main_cuda`) puts every contender's policy and updates on one GPU, the
simulators on CPU cores: collocated, hybrid and SB3 (``device="cuda"``), no planner.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
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
from rlinf_embodied.workflow import EmbodiedSpec, embodied_workflow, fixed_plan
from sb3_ppo import Sb3Setting, VecKind, run_sb3
from sb3_ppo import train_until as sb3_train_until
from torchrl_ppo import Collector, TorchrlSetting, collector_processes, run_torchrl
from torchrl_ppo import train_until as torchrl_train_until

from rlinf.comm import Batch
from rlinf.sched import Cluster, ExecutionPlan, fit_profile, plan, simulate
from rlinf.workers.embodied.actor import EmbodiedActorConfig
from rlinf.workers.embodied.rollout import PolicyRolloutConfig, PolicyRolloutWorker
from rlinf.workers.embodied.run_profile import LINK
from rlinf.workers.env import EnvWorker, EnvWorkerConfig
from rlinf.workers.models.policy import PolicyConfig
from rlinf.workers.runtime import HostAllocator, WorkerContext, allocator_env
from rlinf.workers.training.pricing import link_cluster

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
    allocator: Literal["jemalloc", "system"] = "jemalloc"
    """Host malloc of rlinf's workers (SB3 and torchrl run in this process, which
    `use_allocator` gave the same one)."""


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


def use_allocator(kind: Literal["jemalloc", "system"]) -> None:
    """Give this process (SB3's and torchrl's, and the Ray workers it starts inherit it)
    the host malloc rlinf's workers get: with jemalloc, re-execute the command with it
    preloaded; a no-op once it is (or the user preloaded another, or asked for system)."""
    env = allocator_env(HostAllocator(kind))
    if env:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **env})


def make_spec(s: Setting, *, obs_dim: int, act_dim: int, seed: int = 0) -> EmbodiedSpec:
    return EmbodiedSpec(
        env=EnvWorkerConfig(s.env, num_envs=s.num_envs, pipeline_stages=s.stages, seed=seed,
                            threads=s.env_threads),
        policy=PolicyConfig(obs_shape=(obs_dim,), action_dim=act_dim,
                            hidden_sizes=(s.hidden, s.hidden)),
        actor=EmbodiedActorConfig(epochs=s.epochs, num_minibatches=s.minibatches, seed=seed),
        rollout_steps=s.rollout_steps, seed=seed, device=s.device,
        host_allocator=HostAllocator(s.allocator))


def env_dims(env: str) -> tuple[int, int]:
    """(observation, action) sizes of `env`."""
    probe = EnvWorker(CONTEXT, config=EnvWorkerConfig(env, num_envs=1))
    try:
        return (int(np.prod(probe.observation_space.shape or ())),
                int(np.prod(probe.action_space.shape or ())))
    finally:
        probe.shutdown()


def build_setting(args: argparse.Namespace, device: Literal["cpu", "cuda"]
                  ) -> tuple[Setting, EmbodiedSpec]:
    """The command line's setting, its width calibrated on `device` unless ``--hidden``
    names one, and the spec every rlinf contender runs."""
    num_envs, stages = args.num_envs, 2
    hidden, step_s, infer_s = calibrate(args.env, num_envs, stages, repeats=20, device=device)
    rollout_steps = args.rollout_steps
    if args.minibatch_size:
        args.minibatches = max(1, num_envs * rollout_steps // args.minibatch_size)
    setting = Setting(args.env, num_envs, stages, rollout_steps, args.epochs,
                      args.minibatches, args.hidden or hidden, step_s, infer_s, device=device,
                      env_threads=args.env_threads, allocator=args.allocator)
    obs_dim, act_dim = env_dims(args.env)
    return setting, make_spec(setting, obs_dim=obs_dim, act_dim=act_dim)


LAGGED = "lagged"
"""The policy_lag=1 contender's label."""
LAGGED_PLACEMENT = "env,rollout: 0, actor: 1"
"""Its placement: the actor apart, so the update overlaps the next rollout."""
FIXED_MODES = {"collocated": "collocated", "collocated_all": "env,rollout,actor: 0-1",
               "hybrid": "hybrid"}
"""The fixed modes on the 2 CPU devices and their placements (`workflow.fixed_plan`)."""


def lagged_of(spec: EmbodiedSpec) -> EmbodiedSpec:
    """`spec` as the lagged contender trains it (``algorithm.policy_lag=1``)."""
    return replace(spec, actor=replace(spec.actor, policy_lag=1))


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


def predict(spec: EmbodiedSpec, chosen: ExecutionPlan, cost: Any, cluster: Cluster
            ) -> tuple[float, dict[str, float]]:
    """The simulated seconds per iteration of `chosen`, and each component's busy seconds
    in it (to set beside the measured breakdown)."""
    result = simulate(embodied_workflow(spec), chosen.placement, cost, cluster,
                      micro_batch=dict(chosen.micro_batch))
    return float(result.iteration_time), dict(result.busy_seconds)


@dataclass(frozen=True)
class Peer:
    """One configuration of a peer library: SB3 on a vector env, or torchrl with a
    collector, at a torch thread count."""

    library: Literal["sb3", "torchrl"]
    config: str
    """SB3's vector env (`sb3_ppo.VecKind`) or torchrl's collector (`torchrl_ppo.Collector`)."""
    threads: int

    @property
    def label(self) -> str:
        return f"{self.library}_{self.config}_{self.threads}thr"

    def timed(self, s: Setting, *, warmup: int, iterations: int) -> tuple[list[float], float]:
        """Seconds of each timed iteration and the machine's CPU-seconds over them."""
        if self.library == "sb3":
            return run_sb3(self._sb3(s, 0), self._vec, warmup=warmup, iterations=iterations,
                           threads=self.threads, busy_seconds=machine_busy_seconds)
        return run_torchrl(self._torchrl(s, 0), self._collector, warmup=warmup,
                           iterations=iterations, threads=self.threads,
                           busy_seconds=machine_busy_seconds)

    def train_until(self, s: Setting, *, seed: int, threshold: float, budget_s: float) -> float:
        """Wall seconds to a training return of `threshold` (``inf`` past `budget_s`)."""
        if self.library == "sb3":
            return sb3_train_until(self._sb3(s, seed), self._vec, threshold=threshold,
                                   budget_s=budget_s, threads=self.threads)
        return torchrl_train_until(self._torchrl(s, seed), self._collector,
                                   threshold=threshold, budget_s=budget_s,
                                   threads=self.threads)

    @property
    def _vec(self) -> VecKind:
        return self.config  # type: ignore[return-value]

    @property
    def _collector(self) -> Collector:
        return self.config  # type: ignore[return-value]

    @staticmethod
    def _sb3(s: Setting, seed: int) -> Sb3Setting:
        return Sb3Setting(s.env, s.num_envs, s.rollout_steps, s.epochs, s.minibatches,
                          s.hidden, device=s.device, seed=seed)

    @staticmethod
    def _torchrl(s: Setting, seed: int) -> TorchrlSetting:
        return TorchrlSetting(s.env, s.num_envs, s.rollout_steps, s.epochs,
                              s.num_envs * s.rollout_steps // s.minibatches, s.hidden,
                              seed=seed)


def cpu_peers(args: argparse.Namespace, *, cores: int, num_envs: int) -> list[Peer]:
    """Every peer configuration this machine can run, as their users run them: SB3 with
    torch's default threads (one per core: policy forwards and updates use every core) and
    with one, on DummyVecEnv, SubprocVecEnv and (tox -e bench-embodied installs it)
    envpool's vector env, the fastest simulator path a SB3 user can pick; torchrl with its
    collector in the learner's process (both thread counts) and its multi-process collector
    (one collector process per core). Prints what is left out and why."""
    thread_counts = dict.fromkeys((cores, 1))
    vec_envs = ["dummy", "subproc", "envpool"]
    if args.skip_sb3_subproc:
        vec_envs.remove("subproc")
    if importlib.util.find_spec("envpool") is None:
        vec_envs.remove("envpool")
        print("# envpool is not installed: no SB3 + envpool peer", flush=True)
    peers = [Peer("sb3", vec, t) for vec in vec_envs for t in thread_counts]
    if args.no_torchrl:
        return peers
    if importlib.util.find_spec("torchrl") is None:
        print("# torchrl is not installed: no torchrl peer", flush=True)
        return peers
    peers += [Peer("torchrl", "serial", t) for t in thread_counts]
    processes = collector_processes(num_envs)
    if num_envs % processes == 0:
        peers.append(Peer("torchrl", "multisync", 1))
    else:
        print(f"# {num_envs} envs do not split over {processes} torchrl collector processes: "
              "no MultiSyncCollector peer", flush=True)
    return peers


def machine_busy_seconds() -> float:
    """CPU-seconds spent by every process on this machine so far (/proc/stat): the delta
    over a contender's timed iterations is its CPU time, plus whatever else ran (the load
    average printed beside it says how much that was)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class Tally:
    """Timed iterations of one contender over the rounds."""

    seconds: list[float]
    cpu_seconds: list[float]
    breakdown: list[dict[str, float]]

    def record(self, times: list[float], cpu: float, breakdown: dict[str, float] | None) -> None:
        self.seconds.append(statistics.median(times))
        self.cpu_seconds.append(cpu / len(times))
        if breakdown is not None:
            self.breakdown.append(breakdown)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def median_breakdown(self) -> dict[str, float]:
        return {k: statistics.median(b[k] for b in self.breakdown) for k in BREAKDOWN}


def timed_flow(spec: EmbodiedSpec, chosen: ExecutionPlan, *, warmup: int, iterations: int
               ) -> tuple[list[float], float, dict[str, float]]:
    """Launch `chosen`, run warm-up then timed iterations: (seconds of each timed
    iteration, machine CPU-seconds over them, medians of the breakdown)."""
    with EmbodiedFlow.launch(spec, chosen) as flow:
        for step in range(warmup):
            flow.step(step)
        busy = machine_busy_seconds()
        results = [flow.step(warmup + i) for i in range(iterations)]
        cpu = machine_busy_seconds() - busy
    return ([r.seconds for r in results], cpu,
            {key: statistics.median(r.metrics[key] for r in results) for key in BREAKDOWN})


def rlinf_train_until(spec: EmbodiedSpec, chosen: ExecutionPlan, *, threshold: float,
                      budget_s: float) -> float:
    """Wall seconds (launch excluded) until the end of the first iteration whose rollout's
    ended episodes have a mean return of at least `threshold`; ``inf`` past `budget_s`."""
    with EmbodiedFlow.launch(spec, chosen) as flow:
        started = time.perf_counter()
        step = 0
        while time.perf_counter() - started < budget_s:
            mean_return = flow.step(step).metrics.get("episode_return")
            step += 1
            if mean_return is not None and mean_return >= threshold:
                return time.perf_counter() - started
    return math.inf


def time_to_threshold(args: argparse.Namespace, first: dict[str, Any],
                      peers: list[Peer]) -> dict[str, Any]:
    """Wall time to a training return on ``--threshold-env`` of rlinf's fastest fixed mode,
    the fastest SB3 and the fastest torchrl configuration of `first` (the first width's
    summary), seeds interleaved (rlinf, SB3, torchrl for seed 0, then seed 1 ...); each
    contender's median over seeds. A run that misses the budget counts as infinite."""
    import ray

    st = first["setting"]
    setting = Setting(args.threshold_env, st["num_envs"], st["stages"], st["rollout_steps"],
                      st["epochs"], st["minibatches"], st["hidden"], 0.0, 0.0,
                      env_threads=st["env_threads"], allocator=args.allocator)
    measured = first["measured_s"]
    mode = min((m for m in FIXED_MODES if m in measured), key=lambda m: measured[m])
    speeds = first["env_steps_per_s"]
    fastest = [max(same, key=lambda p: speeds[p.label])
               for library in ("sb3", "torchrl")
               if (same := [p for p in peers if p.library == library])]
    obs_dim, act_dim = env_dims(args.threshold_env)
    budget, threshold = args.threshold_budget_s, args.threshold
    print(f"# time to a training return of {threshold:g} on {args.threshold_env} (budget "
          f"{budget:g} s, {args.threshold_seeds} seeds): rlinf {mode}, "
          f"{', '.join(p.label for p in fastest)}",
          flush=True)
    lagged = LAGGED in measured
    seconds: dict[str, list[float]] = {f"rlinf_{mode}": [],
                                       **({f"rlinf_{LAGGED}": []} if lagged else {}),
                                       **{p.label: [] for p in fastest}}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        for seed in range(args.threshold_seeds):
            spec = make_spec(setting, obs_dim=obs_dim, act_dim=act_dim, seed=seed)
            seconds[f"rlinf_{mode}"].append(rlinf_train_until(
                spec, fixed_plan(spec, FIXED_MODES[mode]), threshold=threshold,
                budget_s=budget))
            if lagged:  # a throughput trick must not hide slower learning
                lagged_spec = lagged_of(spec)
                seconds[f"rlinf_{LAGGED}"].append(rlinf_train_until(
                    lagged_spec, fixed_plan(lagged_spec, LAGGED_PLACEMENT), threshold=threshold,
                    budget_s=budget))
            for peer in fastest:
                seconds[peer.label].append(peer.train_until(
                    setting, seed=seed, threshold=threshold, budget_s=budget))
            print("# seed " + str(seed) + ": " + ", ".join(
                f"{k} {v[-1]:.1f} s" for k, v in seconds.items()), flush=True)
    finally:
        ray.shutdown()
    medians = {k: statistics.median(v) for k, v in seconds.items()}
    fastest_peer = min((p.label for p in fastest), key=lambda label: medians[label])
    ratio = medians[f"rlinf_{mode}"] / medians[fastest_peer]
    extra = {}
    if lagged:
        to_peer = medians[f"rlinf_{LAGGED}"] / medians[fastest_peer]
        to_sync = medians[f"rlinf_{LAGGED}"] / medians[f"rlinf_{mode}"]
        extra = {"lagged_time_to_threshold_ratio": to_peer if math.isfinite(to_peer) else None,
                 "lagged_vs_synchronous_time_to_threshold": (to_sync if math.isfinite(to_sync)
                                                             else None)}
    return {"time_to_threshold_ratio": ratio if math.isfinite(ratio) else None, **extra,
            "time_to_threshold_s": seconds, "threshold": threshold,
            "threshold_env": args.threshold_env, "threshold_fastest_peer": fastest_peer}


def fill_defaults(args: argparse.Namespace) -> None:
    """The user settings of issue #12 (HalfCheetah, 16 envs, 128-step rollouts, PPO 10
    epochs x minibatches of 64, 64x64 and 256x256 MLPs) or, with ``--stress``, the stress
    case, for every flag left unset."""
    stress = args.stress
    if args.num_envs is None:
        args.num_envs = 64 if stress else 16
    if args.rollout_steps is None:
        args.rollout_steps = 32 if args.quick else 64 if stress else 128
    if args.epochs is None:
        args.epochs = 1 if stress else 10
    if args.minibatches is None and args.minibatch_size is None:
        if stress:
            args.minibatches = 2
        else:
            args.minibatch_size = 64
    if args.hidden is None and not stress:
        args.hidden = [64] if args.quick or args.device == "cuda" else [64, 256]


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else list(argv)
    if "--libero" in args_in:  # the LIBERO mode: its own settings (bench_libero.py --help)
        from bench_libero import main as libero_main

        return libero_main([a for a in args_in if a != "--libero"])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small setting, few iterations")
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--stress", action="store_true",
                        help="the stress case instead of the user settings: 64 envs, 64-step "
                             "rollouts, PPO 1 epoch x 2 minibatches, the MLP width calibrated "
                             "so a stage group's forward costs one of its env steps")
    parser.add_argument("--num-envs", type=int, default=None, help="default 16 (stress 64)")
    parser.add_argument("--rollout-steps", type=int, default=None,
                        help="default 128 (stress 64; --quick 32)")
    parser.add_argument("--epochs", type=int, default=None, help="default 10 (stress 1)")
    parser.add_argument("--minibatches", type=int, default=None,
                        help="minibatches per epoch (stress: 2)")
    parser.add_argument("--minibatch-size", type=int, default=None,
                        help="samples per minibatch (default 64; overrides --minibatches: the "
                             "rollout's samples divided by it)")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds (every contender once per round; default 3, "
                             "1 with --quick)")
    parser.add_argument("--max-load", type=float, default=None,
                        help="refuse to start above this 1-minute load average (default: the "
                             "core count; negative: never refuse)")
    parser.add_argument("--settle-load", type=float, default=1.2,
                        help="before each width after the first, wait until the 1-minute load "
                             "average is at most this, at most --settle-s seconds")
    parser.add_argument("--settle-s", type=float, default=180.0)
    parser.add_argument("--hidden", "--width", dest="hidden", type=int, nargs="+",
                        default=None,
                        help="MLP width; several run one after another and the last line "
                             "holds speedup_vs_best_peer_<width> for each (default 64 256; "
                             "--quick or --device cuda: 64; --stress: calibrated)")
    parser.add_argument("--skip-sb3-subproc", action="store_true")
    parser.add_argument("--no-torchrl", action="store_true", help="leave torchrl's peer out")
    parser.add_argument("--no-lagged", action="store_true",
                        help="leave out the policy_lag=1 contender (rollout beside the update)")
    parser.add_argument("--threshold", type=float, default=1000.0,
                        help="training return the learning check waits for (mean over the "
                             "episodes ended in an iteration)")
    parser.add_argument("--threshold-env", default="InvertedDoublePendulum-v5")
    parser.add_argument("--threshold-seeds", type=int, default=3,
                        help="seeds per contender in the learning check (0: skip it)")
    parser.add_argument("--threshold-budget-s", type=float, default=300.0,
                        help="wall seconds a learning-check run may take before it counts "
                             "as never reaching the threshold")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where policies and updates compute (every contender); cuda "
                             "runs collocated, hybrid and SB3, with no planner predictions")
    parser.add_argument("--allocator", choices=("jemalloc", "system"), default="jemalloc",
                        help="host malloc of every contender (default jemalloc: Ray's, "
                             "keeping the pages it frees, rlinf's default; SB3 and torchrl "
                             "get it too: this process restarts itself with it)")
    parser.add_argument("--env-threads", type=int, default=1,
                        help="threads stepping a batched MuJoCo env's physics (rlinf)")
    args = parser.parse_args(argv)
    if args.threshold_seeds < 0 or not args.threshold_budget_s > 0:
        parser.error(f"--threshold-seeds must be >= 0 and --threshold-budget-s > 0, got "
                     f"{args.threshold_seeds} and {args.threshold_budget_s}")
    if argv is None:  # from the command line (sys.argv is what re-executes)
        use_allocator(args.allocator)
    fill_defaults(args)
    widths: list[int | None] = list(args.hidden or [None])
    if args.device == "cuda":
        if len(widths) > 1:
            parser.error("--device cuda takes one --width")
        args.hidden = widths[0]
        return main_cuda(args)
    cores = os.cpu_count() or 1
    max_load = cores if args.max_load is None else args.max_load
    load_before = os.getloadavg()[0]
    if 0 <= max_load < load_before:
        print(f"refused: load average {load_before:.2f} > --max-load {max_load:g}; other work "
              "would be timed too", file=sys.stderr)
        return 3
    peers = cpu_peers(args, cores=cores, num_envs=args.num_envs)
    summaries = []
    for index, width in enumerate(widths):
        if index:  # the profile must not time the previous width's teardown
            settled = settle(args.settle_load, args.settle_s)
            print(f"# load average {settled:.2f} before width {width}", flush=True)
        one = argparse.Namespace(**vars(args))
        one.hidden = width
        summaries.append(run_cpu(one, cores=cores, peers=peers))
    if len(summaries) == 1:
        summary = summaries[0]
    else:  # headline keys: each width's speedup; the worst of the rest
        summary = {key: value for s in summaries for key, value in s.items()
                   if key.startswith("speedup_vs_best_peer_")}
        summary |= {
            "speedup_vs_sb3": summaries[0]["speedup_vs_sb3"],
            "hybrid_speedup_vs_collocated": {s["setting"]["hidden"]:
                                             s["hybrid_speedup_vs_collocated"]
                                             for s in summaries},
            "auto_vs_best_fixed": max(s["auto_vs_best_fixed"] for s in summaries),
            "max_prediction_error": max(s["max_prediction_error"] for s in summaries),
            **({"lagged_speedup_vs_best_fixed": {s["setting"]["hidden"]:
                                                 s["lagged_speedup_vs_best_fixed"]
                                                 for s in summaries}}
               if not args.no_lagged else {}),
            "per_width": {s["setting"]["hidden"]: s for s in summaries},
        }
    if args.threshold_seeds > 0:
        summary |= time_to_threshold(args, summaries[0], peers)
    summary["load_average"] = [load_before, os.getloadavg()[0]]
    print(json.dumps(summary))
    return 0


def settle(load: float, seconds: float) -> float:
    """Wait until the 1-minute load average is at most `load` or `seconds` passed; the load
    then. Each width is profiled once at its start and every prediction comes from that
    profile, so it starts on a machine as quiet as the first width's."""
    deadline = time.monotonic() + seconds
    while os.getloadavg()[0] > load and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def run_cpu(args: argparse.Namespace, *, cores: int, peers: list[Peer]) -> dict[str, Any]:
    """Every contender at one width on the CPU, interleaved in rounds; prints the table and
    returns the summary (the last line's object, for that width)."""
    import ray

    load_before = os.getloadavg()[0]
    warmup, iterations = timing_of(args)
    rounds = args.rounds or (1 if args.quick else 3)
    repeats = 3 if args.quick else 7
    setting, spec = build_setting(args, "cpu")
    num_envs, stages, rollout_steps = setting.num_envs, setting.stages, setting.rollout_steps
    hidden, step_s, infer_s = setting.hidden, setting.env_step_s, setting.infer_s
    print(f"# setting: {args.env}, {num_envs} envs in {stages} stage groups of "
          f"{num_envs // stages}, rollout {rollout_steps} steps, PPO {args.epochs} epochs x "
          f"{args.minibatches} minibatches, MLP {hidden}x{hidden} (policy and value)")
    print(f"# calibration: env step of a group {step_s * 1e3:.2f} ms, policy forward of a "
          f"group {infer_s * 1e3:.2f} ms (ratio {infer_s / step_s:.2f})")
    print(f"# load average {load_before:.1f} on {cores} cores; {rounds} interleaved rounds, "
          f"each contender {iterations} iterations after {warmup} warm-up per round",
          flush=True)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    cluster = Cluster.discover(use_ray=False, cpu_slots=2)
    plans = {mode: fixed_plan(spec, placement) for mode, placement in FIXED_MODES.items()
             if mode != "collocated_all" or stages % 2 == 0}
    if "collocated_all" not in plans:
        print(f"# collocated_all left out: {stages} stage groups do not split over 2 env "
              "workers", flush=True)
    lagged_spec = lagged_of(spec)
    lagged_plan = fixed_plan(lagged_spec, LAGGED_PLACEMENT)
    tallies: dict[str, Tally] = {}
    predicted: dict[str, float] = {}
    lagged_predicted = math.nan
    simulated: dict[str, tuple[float, dict[str, float]]] = {}
    try:
        # Profile once, on the hybrid flow (it has a link to measure), then plan `auto`.
        with EmbodiedFlow.launch(spec, plans["hybrid"]) as flow:
            flow.step(0)
            profile = flow.measure(batch_sizes=[num_envs // 4, num_envs // 2, num_envs],
                                   repeats=repeats, data_parallel=2)
        cost = fit_profile(profile)
        cluster = link_cluster(cluster, embodied_workflow(spec), profile, component=LINK,
                               edge="env->rollout")
        link = [m.seconds for m in profile.measurements if m.component == "link"]
        print(f"# profile: link round trip of a stage group {np.median(link) * 1e3:.2f} ms; "
              f"fitted env/rollout/actor curves from {len(profile.measurements)} points",
              flush=True)
        # Each link message costs the fitted latency, so smaller stage groups are no longer
        # free to the planner (before latency was modelled it split the envs into 16 groups
        # of 4, 2x slower, and the search had to be capped by hand).
        plans["auto"] = plan(embodied_workflow(spec), cost, cluster).best
        simulated = {mode: predict(spec, chosen, cost, cluster) for mode, chosen in plans.items()}
        predicted = {mode: seconds for mode, (seconds, _) in simulated.items()}
        # The lagged plan as the planner prices it (the actor's input ready at the start);
        # the profile's actor points are the synchronous update's (no correction pass).
        lagged_predicted = predict(lagged_spec, lagged_plan, cost, cluster)[0]
        for round_index in range(rounds):
            for mode, chosen in plans.items():
                times, cpu, breakdown = timed_flow(spec, chosen, warmup=warmup,
                                                   iterations=iterations)
                tallies.setdefault(mode, Tally([], [], [])).record(times, cpu, breakdown)
                print(f"# round {round_index + 1} {mode}: {statistics.median(times):.3f} "
                      f"s/iter, load {os.getloadavg()[0]:.1f}", flush=True)
            if not args.no_lagged:
                times, cpu, breakdown = timed_flow(lagged_spec, lagged_plan,
                                                   warmup=max(warmup, 1), iterations=iterations)
                tallies.setdefault(LAGGED, Tally([], [], [])).record(times, cpu, breakdown)
                print(f"# round {round_index + 1} {LAGGED}: {statistics.median(times):.3f} "
                      f"s/iter, load {os.getloadavg()[0]:.1f}", flush=True)
            for peer in peers:
                times, cpu = peer.timed(setting, warmup=warmup, iterations=iterations)
                tallies.setdefault(peer.label, Tally([], [], [])).record(times, cpu, None)
                print(f"# round {round_index + 1} {peer.label}: "
                      f"{statistics.median(times):.3f} s/iter", flush=True)
    finally:
        ray.shutdown()

    samples = num_envs * rollout_steps
    rlinf_modes = [m for m in (*FIXED_MODES, "auto") if m in tallies]
    sb3_labels = [label for label in tallies if label.startswith("sb3_")]
    peer_labels = [label for label in tallies if label not in (*rlinf_modes, LAGGED)]
    print()
    print("medians over rounds of each round's median s/iter; cpu s/1k: machine CPU-seconds "
          "per 1,000 env steps; breakdown (rollout, env step, env wait, train, sync) medians")
    print(f"{'contender':<22} {'plan':<34} {'s/iter':>7} {'pred':>7} {'err':>6} "
          f"{'steps/s':>8} {'cpu s/1k':>8} {'rollout':>8} {'env':>6} {'wait':>6} "
          f"{'train':>6} {'sync':>6}")
    errors = []
    for mode in rlinf_modes:
        tally = tallies[mode]
        err = abs(predicted[mode] - tally.median) / tally.median
        errors.append(err)
        b = tally.median_breakdown()
        plan_text = f"{plans[mode].spec} /{num_envs // plans[mode].micro_batch['env']}"
        print(f"rlinf {mode:<16} {plan_text:<34} {tally.median:>7.3f} {predicted[mode]:>7.3f} "
              f"{err:>6.1%} {samples / tally.median:>8.0f} "
              f"{statistics.median(tally.cpu_seconds) / samples * 1e3:>8.3f} "
              f"{b['rollout_seconds']:>8.3f} {b['env_step_seconds']:>6.3f} "
              f"{b['env_wait_seconds']:>6.3f} {b['train_seconds']:>6.3f} "
              f"{b['sync_seconds']:>6.3f}")
    if LAGGED in tallies:
        tally = tallies[LAGGED]
        b = tally.median_breakdown()
        plan_text = f"{lagged_plan.spec} /{num_envs // lagged_plan.micro_batch['env']}"
        lag_err = abs(lagged_predicted - tally.median) / tally.median
        print(f"rlinf {LAGGED:<16} {plan_text:<34} {tally.median:>7.3f} "
              f"{lagged_predicted:>7.3f} {lag_err:>6.1%} "
              f"{samples / tally.median:>8.0f} "
              f"{statistics.median(tally.cpu_seconds) / samples * 1e3:>8.3f} "
              f"{b['rollout_seconds']:>8.3f} {b['env_step_seconds']:>6.3f} "
              f"{b['env_wait_seconds']:>6.3f} {b['train_seconds']:>6.3f} "
              f"{b['sync_seconds']:>6.3f}")
    for label in peer_labels:
        tally = tallies[label]
        print(f"{label:<22} {'':<34} {tally.median:>7.3f} {'':>7} {'':>6} "
              f"{samples / tally.median:>8.0f} "
              f"{statistics.median(tally.cpu_seconds) / samples * 1e3:>8.3f}")
    best_mode = min(rlinf_modes, key=lambda m: tallies[m].median)
    best_sb3 = min(sb3_labels, key=lambda label: tallies[label].median)
    best_peer = min(peer_labels, key=lambda label: tallies[label].median)
    best_fixed = min(tallies[m].median for m in FIXED_MODES if m in tallies)
    all_cores = "collocated_all" if "collocated_all" in tallies else "collocated"
    lagged = ({"lagged_speedup_vs_best_fixed": best_fixed / tallies[LAGGED].median,
               "lagged_speedup_vs_best_peer": tallies[best_peer].median / tallies[LAGGED].median,
               "lagged_breakdown_s": tallies[LAGGED].median_breakdown(),
               "lagged_predicted_s": lagged_predicted,
               "lagged_prediction_error": abs(lagged_predicted - tallies[LAGGED].median)
               / tallies[LAGGED].median}
              if LAGGED in tallies else {})
    return {
        **lagged,
        f"speedup_vs_best_peer_{hidden}": tallies[best_peer].median / tallies[best_mode].median,
        "hybrid_speedup_vs_collocated": tallies[all_cores].median / tallies["hybrid"].median,
        "hybrid_speedup_vs_collocated_one_device": (tallies["collocated"].median
                                                    / tallies["hybrid"].median),
        "speedup_vs_sb3": tallies[best_sb3].median / tallies[best_mode].median,
        "auto_vs_best_fixed": tallies["auto"].median / best_fixed,
        "max_prediction_error": max(errors),
        "best_mode": best_mode, "sb3_best": best_sb3, "best_peer": best_peer,
        "env_steps_per_s": {m: samples / t.median for m, t in tallies.items()},
        "cpu_seconds_per_1k_steps": {m: statistics.median(t.cpu_seconds) / samples * 1e3
                                     for m, t in tallies.items()},
        "per_round_s": {m: t.seconds for m, t in tallies.items()},
        "predicted_s": predicted,
        "predicted_busy_s": {mode: busy for mode, (_, busy) in simulated.items()},
        "measured_s": {m: tallies[m].median for m in (*rlinf_modes, LAGGED) if m in tallies},
        "breakdown_s": {m: tallies[m].median_breakdown() for m in rlinf_modes},
        "auto_plan": f"{plans['auto'].spec} /{num_envs // plans['auto'].micro_batch['env']}",
        "setting": {"env": args.env, "num_envs": num_envs, "stages": stages,
                    "rollout_steps": rollout_steps, "epochs": args.epochs,
                    "minibatches": args.minibatches, "hidden": hidden,
                    "env_threads": args.env_threads, "rounds": rounds,
                    "iterations": iterations, "env_step_ms": step_s * 1e3,
                    "infer_ms": infer_s * 1e3},
        "load_average": [load_before, os.getloadavg()[0]],
    }


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
        sb3[threads] = statistics.median(Peer("sb3", "dummy", threads).timed(
            setting, warmup=warmup, iterations=iterations)[0])
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
