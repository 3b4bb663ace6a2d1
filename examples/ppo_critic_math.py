"""PPO with a critic and a reference model on generated math, declared once on the flow runtime.

    rollout ──▶ reward ──▶ inference (old log-probs) ──▶ reference (KL) ──▶ actor (PPO, critic)
       ▲                        ▲                                             │
       └────────────────────────┴──────────────── weight sync ◀───────────────┘

This file is the user's whole program: a config, the declaration and the loop. The library
(`rlinf.workers.flow`) starts each component where the placement says, wires one channel per
arrow (owned by its consumer: the driver passes control, never data), runs every iteration
as timed phases, syncs weights and tears everything down. Only ``--placement`` changes:

    python examples/ppo_critic_math.py --placement "rollout,reward,inference,reference,actor: 0"
    python examples/ppo_critic_math.py --placement "rollout: 0, reward,inference,reference,actor: 1"
    python examples/ppo_critic_math.py --placement auto --iterations 4
    python examples/ppo_critic_math.py --cpu-slots 5 \\
        --placement "rollout: 0, reward: 1, inference: 2, reference: 3, actor: 4"
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from rlinf.envs.math import GeneratorConfig, ProblemGenerator
from rlinf.sched import Cluster, Component, Edge
from rlinf.workers import flow as rf
from rlinf.workers.actor import ActorConfig
from rlinf.workers.models import TinyLMConfig, build_tiny_model
from rlinf.workers.reasoning import ActorRole, InferenceRole, RewardRole, RoleSetup, RolloutRole
from rlinf.workers.reward import RewardConfig
from rlinf.workers.rollout import RolloutGeneratorConfig, SamplingConfig


@dataclass(frozen=True)
class Config:
    placement: str = "rollout,reward,inference,reference,actor: 0"
    """A placement spec (`rlinf.sched.parse_placement`), or 'auto'."""
    iterations: int = 2
    """Training iterations."""
    prompts: int = 4
    """Problems per iteration."""
    group_size: int = 2
    """Responses per problem: the unit every component and channel keeps whole."""
    max_new_tokens: int = 6
    """Longest response."""
    cpu_slots: int | None = None
    """Devices of this CPU machine (None: one per core; more oversubscribes it)."""
    profile_sizes: tuple[int, ...] = (4, 8)
    """auto: items per iteration the components are profiled at."""
    profile_devices: tuple[int, ...] | None = None
    """auto: device counts profiled (None: 1 and all)."""
    seed: int = 0
    """Seeds the model, the problems and every sample."""
    timeout: float = 300.0
    """Seconds any wait may take before the run fails instead of hanging."""
    model: TinyLMConfig = field(default_factory=lambda: TinyLMConfig(
        hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128))
    """The policy, built from config (no download); the critic is a copy with a value head."""
    actor: ActorConfig = field(default_factory=lambda: ActorConfig(
        algorithm="ppo", parallelism="ddp", lr=1e-3, micro_batch_size=8, kl_coef=0.05))
    """PPO: clipped surrogate, GAE over a token-level critic, KL to the reference."""


def declare(cfg: Config) -> rf.MacroFlow:
    """Five components, four channels, one weight-sync edge."""
    items = cfg.prompts * cfg.group_size
    setup = RoleSetup(model_factory=functools.partial(build_tiny_model, cfg.model, seed=cfg.seed),
                      seed=cfg.seed, lock_timeout=cfg.timeout, io_timeout=cfg.timeout)
    rollout = RolloutGeneratorConfig(group_size=cfg.group_size, groups_per_micro_batch=2,
                                  sampling=SamplingConfig(max_new_tokens=cfg.max_new_tokens))
    temperature = cfg.actor.temperature

    def part(name: str, worker: type[Any], entry: str, resource: str = "gpu",
             **kwargs: Any) -> rf.ComponentSpec:
        return rf.ComponentSpec(Component(name, resource=resource, batch=items,
                                          micro_batch_multiple=cfg.group_size,  # whole groups
                                          streaming=name == "rollout"),
                                worker, entry=entry, init_kwargs={"setup": setup, **kwargs})

    components = (
        part("rollout", RolloutRole, "rollout_step", config=rollout),
        part("reward", RewardRole, "reward_step", resource="cpu",
             config=RewardConfig(format_penalty=0.5)),  # -0.5 without a number: a signal
        part("inference", InferenceRole, "inference_step", temperature=temperature),
        part("reference", InferenceRole, "inference_step", temperature=temperature,
             recompute=False, reference=True),
        dataclasses.replace(part("actor", ActorRole, "train_step", config=cfg.actor),
                            setup="build", distributed=True),
    )
    # A message's bytes need no estimate: profiling measures what each channel carries.
    channels = tuple(rf.ChannelSpec(Edge(a.name, b.name), granularity=cfg.group_size)
                     for a, b in itertools.pairwise(components))  # a group per message
    return rf.MacroFlow(components, channels,
                        weight_syncs=(rf.WeightSyncSpec("actor", ("inference", "rollout")),),
                        global_batch=items, name="ppo-critic-math")


def main(cfg: Config) -> dict[str, Any]:
    """Launch, train `cfg.iterations` iterations, close; returns (and prints) a summary."""
    flow = declare(cfg)
    cluster = Cluster.discover(cpu_slots=cfg.cpu_slots)
    report = None  # what this run feeds the flow: the rollout's prompts
    inputs = {"rollout": {"problems": ProblemGenerator(GeneratorConfig.for_level(
        1, seed=cfg.seed)).batch}}
    if cfg.placement == "auto":
        run, report = rf.launch_auto(flow, cluster, batch_sizes=cfg.profile_sizes,
                                     device_counts=cfg.profile_devices, timeout=cfg.timeout,
                                     inputs=inputs)
    else:
        plan = flow.fixed_plan(cfg.placement, num_devices=cluster.num_devices)
        run = rf.FlowRun.launch(flow, plan, cluster=cluster, timeout=cfg.timeout,
                                inputs=inputs)
    with run:
        before = run.groups["actor"].call("parameter_norm")[0]
        records = [run.step(k) for k in range(cfg.iterations)]
        after = run.groups["actor"].call("parameter_norm")[0]
    for r in records:
        print(f"step {r.step}: {r.seconds:.2f} s, accuracy {r.metrics['reward/accuracy']:.2f}, "
              + ", ".join(f"{k} {r.metrics[f'actor/{k}']:.4f}"
                          for k in ("policy_loss", "value_loss", "kl")))
    summary: dict[str, Any] = {
        "placement": run.plan.spec, "mode": run.plan.mode.value,
        "device_lock": run.uses_device_lock, "weight_sync": list(run.weight_transports),
        "parameter_norm": [before, after], "lock_holds": [r.lock_holds for r in records],
        "iteration_s": [r.seconds for r in records],
        "losses": {k: [r.metrics[f"actor/{k}"] for r in records]
                   for k in ("policy_loss", "value_loss", "kl")}}
    if report is not None:  # auto: what the planner predicted against what ran
        summary.update(report.compare(records[1:] or records), profile_s=report.profile_seconds)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--placement", default=Config.placement, help="a spec, or 'auto'")
    parser.add_argument("--iterations", type=int, default=Config.iterations)
    parser.add_argument("--prompts", type=int, default=Config.prompts)
    parser.add_argument("--cpu-slots", type=int, default=None, help="devices of this machine")
    args = parser.parse_args()
    main(Config(placement=args.placement, iterations=args.iterations, prompts=args.prompts,
                cpu_slots=args.cpu_slots))
