"""The embodied app's part of a training run: `EmbodiedTask` for the library's runner
(`rlinf.workers.training.train`), which resumes, plans, launches, loops, checkpoints and
restarts.

    spec, workflow ← config (spec.py; the env is probed for its shapes) → the runner:
    plan (a fixed placement, or auto; priced from the profile cache or the run's first
    iterations) → launch → evaluation of the initial policy → iterations (evaluation every
    `eval_every`, checkpoint every `checkpoint_every`) → evaluation of the trained policy
    (+ one episode recorded as eval.gif) → learning curve, trace and timeline, summary

`--resume` continues from the latest checkpoint in the run folder: the flow's state
(policy, critic, optimizer, RNG, env state) is restored and the run goes on with the
checkpoint's plan as if never interrupted. A checkpoint written by a different config
(other than `RESUMABLE_KEYS`) is refused.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rlinf.sched import Cluster, ExecutionPlan, Profile
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow.auto import probe_iterations
from rlinf.workers.schema import flat_dict
from rlinf.workers.telemetry import Span, plot_learning_curve, write_run_trace, write_video
from rlinf.workers.training import (
    PlanChoice,
    RunOutcome,
    RunSettings,
    collocated_devices,
)
from rlinf.workers.training import dry_run as run_dry
from rlinf.workers.training import train as run_training
from rlinf_embodied.config import AppConfig, PlacementConfig, ray_options, resolve_placement
from rlinf_embodied.pricing import (
    EmbodiedPricing,
    cluster_for,
    fixed_plan,
    placement_on,
    profile_batch_sizes,
)
from rlinf_embodied.profile_reuse import profile_identity
from rlinf_embodied.spec import build_spec
from rlinf_embodied.summary import RunSummary, target_reached

if TYPE_CHECKING:
    from rlinf_embodied.evaluation import EvalResult
    from rlinf_embodied.flow import EmbodiedFlow, EmbodiedStepResult

__all__ = ["RESUMABLE_KEYS", "EmbodiedTask", "dry_run", "train"]

RESUMABLE_KEYS = frozenset({"run.iterations", "run.run_dir", "run.max_restarts",
                            "run.profile_cache", "run.loggers"})
"""Config keys that may differ between a checkpoint and the run resuming from it."""
EVAL_SEED_OFFSET = 1_000_003
"""Evaluation envs are seeded away from training envs (run.seed + this)."""
PROFILE_REPEATS = 3
"""Timed calls per profiled point (median; after a warm-up call)."""
PROBE_ITERATIONS = 3
"""Real iterations each profiling flow runs (the first a warm-up) so that planning prices the
env ↔ policy link (`rlinf.workers.training.pricing.calibrated_link`) and the devices' hand-overs
(`rlinf.workers.training.pricing.fitted_turns`) as they ran there."""
CURVE_FILE = "learning_curve.png"
VIDEO_FILE = "eval.gif"
PROGRESS_KEYS = ("episode_return", "success_rate", "env_steps_per_s", "eval_return")


def run_settings(cfg: AppConfig) -> RunSettings:
    """The runner's settings of `cfg`'s ``run`` section and placement."""
    return cfg.run.settings(steps=cfg.run.iterations, auto=cfg.placement.spec.strip() == "auto",
                            unit="iteration", progress_desc=cfg.env.id,
                            progress_keys=PROGRESS_KEYS)


def _eval_metrics(result: EvalResult) -> dict[str, float]:
    out = {"eval_return": result.mean_return}
    if result.success_rate is not None:
        out["eval_success_rate"] = result.success_rate
    return out


class EmbodiedTask:
    """`rlinf.workers.training.TrainingTask` of an embodied run."""

    resumable_keys = RESUMABLE_KEYS

    def __init__(self, cfg: AppConfig) -> None:
        from rlinf_embodied.workflow import embodied_workflow

        self.cfg = cfg
        self.settings = run_settings(cfg)
        self.spec = build_spec(cfg)
        self.pricing = EmbodiedPricing(embodied_workflow(self.spec))
        self._workflow = self.pricing.workflow
        self._final: EvalResult | None = None
        """The last evaluation, with the recorded episode (`write_outputs`)."""

    # -- configuration --------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return flat_dict(self.cfg)

    def default_config(self) -> dict[str, Any]:
        return flat_dict(AppConfig())

    def announce(self, out: TextIO) -> None:
        cfg = self.cfg
        print(f"task: {cfg.env.id}, {cfg.env.num_envs} envs; {cfg.algorithm.name}; "
              f"{cfg.run.iterations} iterations of {cfg.run.rollout_steps} steps per env",
              file=out)

    def ray_options(self) -> dict[str, Any]:
        return ray_options(self.cfg)

    def cluster(self) -> Cluster:
        return cluster_for(self.cfg.placement)

    # -- planning -----------------------------------------------------------------------------
    def profile_identity(self) -> dict[str, Any]:
        return profile_identity(self.cfg, self._batch_sizes())

    def _batch_sizes(self) -> tuple[int, ...]:
        return profile_batch_sizes(self.cfg.env.num_envs, self.cfg.env.pipeline_stages)

    def fixed_plan(self, cluster: Cluster) -> ExecutionPlan:
        return fixed_plan(placement_on(self.cfg.placement, self._workflow, cluster),
                          self._workflow, pipeline_stages=self.cfg.env.pipeline_stages)

    def first_guess(self, cluster: Cluster) -> ExecutionPlan:
        """Every component collocated (`rlinf.workers.training.collocated_devices`): one env
        worker per device with its policy inline, the actor spanning them; on fewer devices
        while the envs do not split evenly over them."""
        devices = collocated_devices(cluster)
        while devices > 1 and not self._splits(devices):
            devices -= 1
        placement = placement_on(PlacementConfig(spec="collocated", num_devices=devices),
                                 self._workflow, cluster)
        return fixed_plan(placement, self._workflow,
                          pipeline_stages=self.cfg.env.pipeline_stages)

    def _splits(self, workers: int) -> bool:
        """Whether `workers` env workers split every stage group evenly."""
        from rlinf_embodied.spec import env_worker_config

        config = env_worker_config(self.cfg)
        try:
            for rank in range(workers):
                config.shard(rank, workers)
        except ConfigError:
            return False
        return True

    def compatible(self, current: ExecutionPlan, candidate: ExecutionPlan) -> bool:
        """A checkpoint holds every env worker's and policy process's state at its stage
        groups: it loads into a plan with the same stage groups, env workers and policy
        processes, the policy inline in both or in neither (`checkpoint.load_flow`)."""
        from rlinf_embodied.flow import stages_of

        def shape(plan: ExecutionPlan) -> tuple[int, int, int, bool]:
            comps = plan.placement.components
            inline = comps["env"].devices == comps["rollout"].devices
            return (stages_of(self.spec, plan), comps["env"].num_procs,
                    comps["rollout"].num_procs, inline)

        return shape(current) == shape(candidate)

    def profile(self, cluster: Cluster) -> Profile:
        """Short-lived flows that profile each component (`EmbodiedFlow.measure`). With two
        or more devices the policy runs in a process of its own on another device, so the
        env ↔ policy link is measured too (the planner prices pipelined placements by it),
        and env and policy are timed on two processes at once (what splitting them over
        devices buys); on one device there is neither a link nor a split to price. Either
        way real iterations run with the policy inline too (on one device, a second flow
        when the first had a link), which price the devices' hand-overs
        (`rlinf.workers.training.pricing.fitted_turns`)."""
        from rlinf_embodied.flow import EmbodiedFlow

        def launched(probe: PlacementConfig) -> EmbodiedFlow:
            placement = resolve_placement(probe, components=self._workflow.names)
            return EmbodiedFlow.launch(self.spec, fixed_plan(
                placement, self._workflow, pipeline_stages=self.cfg.env.pipeline_stages))

        linked = self.cfg.placement.num_devices >= 2
        probe = PlacementConfig(spec="env, actor: 0, rollout: 1" if linked else "collocated",
                                num_devices=2 if linked else 1)
        with launched(probe) as flow:
            profile = flow.measure(batch_sizes=self._batch_sizes(), repeats=PROFILE_REPEATS,
                                   probe_iterations=PROBE_ITERATIONS,
                                   data_parallel=2 if linked else 1)
        if linked:  # the hand-overs, where no message crosses
            with launched(PlacementConfig(spec="collocated", num_devices=1)) as flow:
                profile = profile.merge(probe_iterations(
                    flow.run, items=self.cfg.env.num_envs, iterations=PROBE_ITERATIONS,
                    collocated=True))
        return profile

    # -- the run ------------------------------------------------------------------------------
    def launch(self, plan: ExecutionPlan, cluster: Cluster) -> EmbodiedFlow:
        from rlinf_embodied.flow import EmbodiedFlow

        return EmbodiedFlow.launch(self.spec, plan, cluster=cluster, trace=self.cfg.run.trace)

    def evaluate(self, flow: EmbodiedFlow, step: int, *, final: bool) -> dict[str, float]:
        """Deterministic episodes of fresh envs (seeded away from the training envs); the
        final one records an episode when ``run.video``."""
        run = self.cfg.run
        result = flow.evaluate(num_episodes=run.eval_episodes,
                               seed=run.seed + EVAL_SEED_OFFSET, max_steps=run.eval_max_steps,
                               record_video=final and run.video)
        self._final = result
        return _eval_metrics(result)

    def record(self, result: EmbodiedStepResult, *,
               counted: int) -> tuple[dict[str, float], int]:
        return ({**result.metrics, "env_steps": float(counted + result.env_steps)},
                result.env_steps)

    def checkpointed(self, step: int, path: Path) -> None:
        """Nothing to add: `rlinf-embodied export` reads the checkpoints."""

    def write_outputs(self, records: Sequence[Mapping[str, float]], spans: Sequence[Span],
                      last_spans: Sequence[Span], choice: PlanChoice, *, out: TextIO) -> None:
        """The learning curve, the recorded episode, and with ``run.trace`` every span in
        ``trace.json`` and the last iteration above its prediction in ``timeline.png``."""
        cfg, run_dir = self.cfg, self.settings.run_dir
        ys = [y for y in ("episode_return", "eval_return", "success_rate", "eval_success_rate")
              if any(y in r for r in records)]
        plot_learning_curve(records, ys=ys, path=run_dir / CURVE_FILE,
                            title=f"{cfg.env.id} ({cfg.algorithm.name})")
        final = self._final
        if cfg.run.video and final is not None and final.frames is not None \
                and len(final.frames):
            write_video(final.frames, run_dir / VIDEO_FILE, fps=30)
        if cfg.run.trace and spans:
            trace, timeline = write_run_trace(run_dir, spans, last_spans, choice.simulation)
            print(f"trace: {trace} (chrome://tracing or ui.perfetto.dev), timeline: {timeline}",
                  file=out)

    def summarize(self, outcome: RunOutcome) -> RunSummary:
        run, before, after = self.cfg.run, outcome.before, outcome.after
        success_after = after.get("eval_success_rate")
        seconds = outcome.wall_seconds
        summary = RunSummary(
            **RunSummary.of_run(outcome, self.settings.run_dir),
            task=self.cfg.env.id, algorithm=self.cfg.algorithm.name,
            eval_return_before=float(before.get("eval_return", math.nan)),
            eval_return_after=float(after.get("eval_return", math.nan)),
            success_before=before.get("eval_success_rate"), success_after=success_after,
            target_return=run.target_return, target_success_rate=run.target_success_rate,
            target_reached=target_reached(
                mean_return=float(after.get("eval_return", math.nan)),
                success_rate=success_after, target_return=run.target_return,
                target_success_rate=run.target_success_rate),
            env_steps=outcome.counted_total,
            env_steps_per_s=outcome.counted_total / seconds if seconds > 0 else 0.0,
            policy_lag=self.cfg.algorithm.policy_lag)
        summary.save(self.settings.run_dir)
        return summary

    def print_summary(self, summary: RunSummary, out: TextIO) -> None:
        print(summary.format(), file=out)


def train(cfg: AppConfig, *, resume: bool = False, stream: TextIO | None = None,
          ray_started: bool = False, overrides: Sequence[str] = ()) -> RunSummary:
    """Run (or resume) training as the config says; prints and returns the summary
    (`rlinf.workers.training.train`: restarts, resume, live pricing)."""
    summary: RunSummary = run_training(EmbodiedTask(cfg), resume=resume, overrides=overrides,
                                       out=stream or sys.stdout, ray_started=ray_started)
    return summary


def dry_run(cfg: AppConfig, *, out: TextIO = sys.stdout) -> PlanChoice:
    """Print the plan the run would use (`rlinf.workers.training.dry_run`); for `auto`,
    from probe runs that measure a profile (and cache it) when none is cached."""
    return run_dry(EmbodiedTask(cfg), out=out, measure=True)
