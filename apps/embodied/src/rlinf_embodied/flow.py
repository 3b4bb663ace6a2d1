"""The embodied run on the flow runtime: `FlowRun` over `workflow.declare(spec)`, plus what
only this task adds — episode metrics, evaluation, checkpoints and the profile `auto`
plans with.

One iteration (`EmbodiedFlow.step`) is the runtime's: the env role runs the env ↔ policy
loop (with the policy inside its process where the plan co-places them, else pipelined
over p2p messages with a policy process: while the policy computes group g+1's actions the
env steps group g), puts the trajectory into the actor's channel; the actor trains on it;
the runtime then syncs the weights into the policy. The driver passes control only. With
the same seed and stage groups every placement produces identical trajectories and metrics
(tested). An env component placed on several devices runs one env worker per device, each
with an equal share of the envs (and its inline policy, or its policy process's batched
answers); their metrics are pooled here. With ``algorithm.policy_lag=1`` the runtime runs
the actor one iteration behind: iteration k's rollout runs beside the update on iteration
k-1's trajectory, and ``step(k, drain=True)`` then trains iteration k's too (before a
checkpoint, at the end).

Resuming: `save` writes the actor, the rollout policy's sampling streams and the
simulators' exact state (`checkpoint`), so a loaded flow continues the same trajectory.
Backends whose state cannot be captured (ManiSkill3, LIBERO) use
``reset_every_iteration=True``: every iteration then starts from resets seeded by (seed,
step) and needs no env state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from rlinf.sched import Cluster, ExecutionPlan, Profile
from rlinf.workers.embodied.roles import (
    EnvDescription,
    episode_means,
    pool_rollout_metrics,
    weights_from_wire,
)
from rlinf.workers.embodied.run_profile import profile_run
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import FlowRun
from rlinf.workers.flow.launched import IterationResult, LaunchedFlow
from rlinf_embodied.checkpoint import load_flow, save_flow
from rlinf_embodied.evaluation import EvalResult, evaluate
from rlinf_embodied.workflow import (
    COMPONENTS,
    EmbodiedSpec,
    declare,
    describe,
    embodied_workflow,
    fixed_plan,
    policy_configs,
    stages_of,
)

__all__ = ["COMPONENTS", "EmbodiedFlow", "EmbodiedSpec", "EmbodiedStepResult", "EvalResult",
           "embodied_workflow", "fixed_plan", "stages_of"]

_CPU_PER_RANK = 0.25
"""Ray CPUs per process: a probe flow, the profile and the run (or a test's two flows) fit
side by side on a small Ray cluster; the processes share the cores as the OS schedules."""


@dataclass(frozen=True, kw_only=True)
class EmbodiedStepResult(IterationResult):
    """One iteration's outcome: episode_return/episode_length/success_rate (when episodes
    ended), env_steps_per_s, loss terms and per-component seconds; spans per env_step/infer
    of each stage group, train and weight sync."""

    env_steps: int
    """Env steps taken."""


class EmbodiedFlow(LaunchedFlow):
    """The launched flow of one run (module docstring); build with `launch`."""

    def __init__(self, spec: EmbodiedSpec, run: FlowRun, *, description: EnvDescription,
                 stages: int, trace: bool) -> None:
        super().__init__(run, trace=trace)
        self.spec = spec
        self.description = description
        self.stages = stages
        self._rollout_config, self._actor_config = policy_configs(spec, description)

    @classmethod
    def launch(cls, spec: EmbodiedSpec, plan: ExecutionPlan, *, cluster: Cluster | None = None,
               trace: bool = False) -> EmbodiedFlow:
        """Start the workers where `plan.placement` says (on Ray when it is initialised,
        else as processes of this machine); with ``device='cuda'`` and no GPU there the
        launch refuses before anything starts."""
        missing = [c for c in COMPONENTS if c not in plan.placement.components]
        if missing:
            raise ConfigError(f"plan {plan.spec!r} does not place {missing}: expected env, "
                              "rollout and actor (see embodied_workflow)")
        stages = stages_of(spec, plan)
        description = describe(spec)
        rollout, actor = policy_configs(spec, description)
        flow = declare(spec, stages=stages, rollout=rollout, actor=actor)
        run = FlowRun.launch(flow, plan, cluster=cluster, log_level="WARNING", stop_ray=False,
                             timeout=spec.rollout_timeout, cpus_per_rank=_CPU_PER_RANK,
                             trace=trace)
        return cls(spec, run, description=description, stages=stages, trace=trace)

    @property
    def inline(self) -> bool:
        """Whether env and policy share one process (the plan co-places them)."""
        return "rollout" in self.run.inlined

    def step(self, step: int, *, drain: bool = False) -> EmbodiedStepResult:
        """One iteration: rollout → actor training → weight sync (module docstring). With a
        policy lag the update trains on the previous rollout meanwhile (none right after a
        drain), and `drain` also trains this one before returning; the loss terms are the
        latest update's, ``train_seconds`` all of the iteration's."""
        wall_start = time.time()
        records = self.run.iteration(step, drain=drain)
        env = pool_rollout_metrics(records[0].rank_metrics["env"])
        updates = [r.rank_metrics["actor"][0] for r in records if "actor" in r.rank_metrics]
        trained = dict(updates[-1]) if updates else {}
        trained.pop("train_seconds", None)
        seconds = sum(r.seconds for r in records)
        sync_s = sum(p.seconds for r in records for p in r.phases if not p.is_component)
        metrics: dict[str, float] = {
            **episode_means(env), **trained,
            "env_steps_per_s": env["env_steps"] / seconds,
            "rollout_steps_per_s": env["env_steps"] / env["rollout_seconds"],
            "rollout_seconds": env["rollout_seconds"],
            "train_seconds": sum(u["train_seconds"] for u in updates),
            "sync_seconds": sync_s, "env_step_seconds": env["step_seconds"],
            "env_wait_seconds": env["wait_seconds"], "iteration_seconds": seconds}
        return EmbodiedStepResult(
            step=step, metrics=metrics, seconds=seconds, env_steps=int(env["env_steps"]),
            spans=tuple(self.drain_spans()), onloads=self.onloads(since=wall_start))

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The actor's current parameters (CPU copies)."""
        return weights_from_wire(self.group("actor").call("get_weights")[0])

    def evaluate(self, *, num_episodes: int, seed: int, record_video: bool = False,
                 max_steps: int = 1000) -> EvalResult:
        """Mean return of each of `num_episodes` fresh envs' first episode, acting with the
        current weights deterministically (in the driver; `evaluation.evaluate`)."""
        return evaluate(self.spec.env, self._rollout_config, self.get_weights(),
                        num_episodes=num_episodes, seed=seed, record_video=record_video,
                        max_steps=max_steps)

    # -- checkpoints -----------------------------------------------------------------------

    def save(self, directory: Path) -> None:
        """Write actor, rollout policy and env state (`checkpoint.save_flow`)."""
        save_flow(self, directory)

    def load(self, directory: Path) -> None:
        """Restore what `save` wrote (`checkpoint.load_flow`)."""
        load_flow(self, directory)

    # -- profiling -------------------------------------------------------------------------

    def measure(self, *, batch_sizes: Sequence[int], repeats: int = 5,
                probe_iterations: int = 0, data_parallel: int = 1) -> Profile:
        """Per-component profile for `auto` (`rlinf.workers.embodied.run_profile`): the
        components at each batch size, the link's round trips with a policy process, and on
        a throw-away flow (``auto``'s probe) `probe_iterations` real iterations."""
        return profile_run(self.run, env=self.spec.env, rollout=self._rollout_config,
                           actor=self._actor_config, rollout_steps=self.spec.rollout_steps,
                           batch_sizes=batch_sizes, repeats=repeats,
                           iterations=probe_iterations, data_parallel=data_parallel,
                           timeout=self.spec.link_timeout)
