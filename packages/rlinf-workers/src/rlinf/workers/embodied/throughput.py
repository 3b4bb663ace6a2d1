"""Env steps/s of the collocated and pipelined drivers at one setting.

Run: ``python -m rlinf.workers.embodied.throughput --env HalfCheetah-v5 --num-envs 16
--stages 2 --hidden 256 --steps 100 --repeats 5``. Prints one JSON line per schedule with the
median steps/s, the share of the wall time spent inside the simulators (0.5 under collocated
means simulation and inference cost about the same, where pipelining can gain most) and the
median over rounds of each schedule's steps/s over collocated's in the same round.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from rlinf.workers.embodied.drivers import run_collocated, run_pipelined
from rlinf.workers.embodied.process_driver import PolicyProcess, run_pipelined_process
from rlinf.workers.embodied.rollout import PolicyRolloutConfig, PolicyRolloutWorker
from rlinf.workers.env.config import EnvWorkerConfig
from rlinf.workers.env.worker import EnvRollout, EnvWorker
from rlinf.workers.models.policy import PolicyConfig
from rlinf.workers.runtime.context import WorkerContext

__all__ = ["ThroughputResult", "measure"]


@dataclass(frozen=True)
class ThroughputResult:
    """Medians over the repeats of one schedule."""

    schedule: str
    """"collocated", "pipelined" (policy thread) or "process" (policy process)."""
    steps_per_s: float
    """Median env steps per second."""
    sim_share: float
    """Median share of the wall time spent inside the simulators' step."""
    runs: tuple[float, ...]
    """Steps/s of every repeat, in order."""


def measure(*, env_name: str, num_envs: int, stages: int, hidden: int, steps: int,
            repeats: int, seed: int = 0) -> list[ThroughputResult]:
    """Interleave collocated, thread-pipelined and process-pipelined rollouts (`repeats` each,
    after one warm-up each) so that load from other processes hits all alike; all use
    `stages` stage groups."""
    context = WorkerContext(role="bench", rank=0, world_size=1)
    env = EnvWorker(context, config=EnvWorkerConfig(
        env_name=env_name, num_envs=num_envs, pipeline_stages=stages, seed=seed))
    obs_dim = int(env.observation_space.shape[0])  # type: ignore[index]
    action_dim = int(env.action_space.shape[0])  # type: ignore[index]
    config = PolicyRolloutConfig(
        policy=PolicyConfig(obs_shape=(obs_dim,), action_dim=action_dim,
                            hidden_sizes=(hidden, hidden)), seed=seed, num_threads=1)
    policy = PolicyRolloutWorker(context, config=config)
    remote = PolicyProcess(config)
    drivers: dict[str, Callable[[], EnvRollout]] = {
        "collocated": lambda: run_collocated(env, policy, num_steps=steps),
        "pipelined": lambda: run_pipelined(env, policy, num_steps=steps),
        "process": lambda: run_pipelined_process(env, remote, num_steps=steps),
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in drivers}
    try:
        for repeat in range(repeats + 1):
            for name, driver in drivers.items():
                rollout = driver()
                if repeat:  # the first round warms up torch and the simulators
                    runs[name].append((rollout.steps_per_s,
                                       rollout.step_seconds / rollout.seconds))
    finally:
        remote.close()
        env.shutdown()
    return [ThroughputResult(
        schedule=name, steps_per_s=statistics.median(r[0] for r in rows),
        sim_share=statistics.median(r[1] for r in rows), runs=tuple(r[0] for r in rows))
        for name, rows in runs.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    results = measure(env_name=args.env, num_envs=args.num_envs, stages=args.stages,
                      hidden=args.hidden, steps=args.steps, repeats=args.repeats)
    for result in results:
        print(json.dumps({**vars(args), **result.__dict__}))
    # Paired per round: other processes' load changes between rounds more than within one.
    base = results[0].runs
    print(json.dumps({f"{r.schedule}_over_collocated_paired_median": round(statistics.median(
        a / b for a, b in zip(r.runs, base, strict=True)), 3) for r in results[1:]}))


if __name__ == "__main__":
    main()
