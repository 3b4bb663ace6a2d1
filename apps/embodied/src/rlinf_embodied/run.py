"""The training loop of the app: plan, launch the flow, evaluate, train, checkpoint, report.

    spec, workflow ← config               (spec.py; the env is probed for its shapes)
    plan           ← fixed placement, or profile + M2Flow planner for `auto` (planning.py)
    flow           ← EmbodiedFlow.launch(spec, plan)
    evaluate the initial policy                                   → metrics.jsonl step 0
    for step in 1..iterations: flow.step → metrics (+ evaluation every eval_every)
                               → checkpoint every checkpoint_every and after the last
    evaluate the trained policy (+ one episode recorded as eval.gif)
    learning curve PNG, optional Chrome trace + timeline PNG, summary (printed + JSON)

`--resume` continues from the latest checkpoint in the run directory: the flow's state
(policy, critic, optimizer, RNG, env state) is restored, metrics records past the
checkpoint are dropped (they are redone), and the run goes on as if never interrupted, with
the checkpoint's plan (`auto` is not profiled again). A checkpoint written by a different
config (other than `run.iterations`, `run.max_restarts` and `run.profile_cache`) is
refused.

Self-healing (`run.max_restarts`): when a worker dies the flow has already torn down what
was left; `train` records the restart and resumes itself as above (from the start when no
checkpoint was taken yet), at most `max_restarts` times; restarts go into the metrics
(``run/restarts`` at the iteration the run went on from) and the summary.
"""

from __future__ import annotations

import io
import math
import statistics
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import structlog

from rlinf.sched import Cluster, ExecutionPlan, Profile, ProfileCache, Workflow
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import ensure_ray, with_restarts
from rlinf.workers.runtime.ray_session import stop_ray
from rlinf.workers.telemetry import (
    CheckpointStore,
    ProgressDisplay,
    Span,
    metrics_writer,
    plot_learning_curve,
    plot_timeline,
    predicted_spans,
    read_metrics,
    write_chrome_trace,
    write_run_config,
    write_video,
)
from rlinf_embodied.config import AppConfig, PlacementConfig, ray_options, resolve_placement
from rlinf_embodied.errors import CheckpointMismatchError
from rlinf_embodied.planning import (
    Measure,
    PlanChoice,
    choose_plan,
    cluster_for,
    fixed_plan,
    format_plans,
    priced,
    profile_batch_sizes,
    simulate_plan,
)
from rlinf_embodied.profile_reuse import reusing, usable_cache
from rlinf_embodied.schema import to_dict
from rlinf_embodied.spec import build_spec
from rlinf_embodied.summary import RunSummary, target_reached
from rlinf_embodied.trials import tried_choice

if TYPE_CHECKING:
    from rlinf_embodied.evaluation import EvalResult
    from rlinf_embodied.flow import EmbodiedFlow
    from rlinf_embodied.workflow import EmbodiedSpec

__all__ = ["RESUMABLE_KEYS", "check_resumable", "dry_run", "train"]

_log = structlog.get_logger(__name__)

RESUMABLE_KEYS = frozenset({"run.iterations", "run.run_dir", "run.max_restarts",
                            "run.profile_cache", "run.loggers"})
"""Config keys that may differ between a checkpoint and the run resuming from it."""

CHECKPOINT_DIR = "checkpoints"
EVAL_SEED_OFFSET = 1_000_003
"""Evaluation envs are seeded away from training envs (run.seed + this)."""
PROFILE_REPEATS = 3
"""Timed calls per profiled point (median; after a warm-up call)."""
PROBE_ITERATIONS = 3
"""Real iterations each profiling flow runs (the first a warm-up) so that planning prices the
env ↔ policy link (`planning.calibrated_link`) and the devices' hand-overs
(`planning.fitted_turns`) as they ran there."""
PROFILE_FILE = "profile.json"
"""The measured profile a plan was priced with (`auto`, or a traced fixed placement), as
`rlinf.sched.Profile.save` writes it: what the planner believed, to compare with the run."""
_TRACE_ITERATIONS = 5
"""Iterations whose spans go into the Chrome trace (the first ones of the run segment)."""


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_resumable(saved: Mapping[str, Any], cfg: AppConfig, *, path: str) -> None:
    """Refuse a checkpoint whose config differs from `cfg` outside `RESUMABLE_KEYS`."""
    old, new = _flatten(saved), _flatten(to_dict(cfg))
    diffs = tuple(f"{k}: {old.get(k, '<absent>')!r} -> {new.get(k, '<absent>')!r}"
                  for k in sorted(old.keys() | new.keys())
                  if k not in RESUMABLE_KEYS and old.get(k) != new.get(k))
    if diffs:
        raise CheckpointMismatchError(path, diffs)


@contextmanager
def _ray_session(cfg: AppConfig) -> Iterator[None]:
    """Ray for the run: connect to ``RAY_ADDRESS`` when set, else start a local instance
    (stopped afterwards); an already initialised Ray is used as is."""
    if not ensure_ray(**ray_options(cfg)):  # an already initialised Ray is used as is
        yield
        return
    try:
        yield
    finally:
        stop_ray()


def _profiling_flow(spec: EmbodiedSpec, cfg: AppConfig, workflow: Workflow) -> Measure:
    """A `Measure` that launches a short-lived flow, has it profile each component
    (`EmbodiedFlow.measure`) and closes it. With two or more devices the policy runs in a
    process of its own on another device, so the env ↔ policy link is measured too (the
    planner prices pipelined placements by it), and env and policy are timed on two
    processes at once (what splitting them over devices buys); on one device there is
    neither a link nor a split to price. Either way real iterations run with the policy
    inline too (on one device, a second short-lived flow when the first had a link), which
    price the devices' hand-overs (`planning.fitted_turns`)."""
    from rlinf_embodied.flow import EmbodiedFlow

    def launched(probe: PlacementConfig) -> EmbodiedFlow:
        placement = resolve_placement(probe, components=workflow.names)
        return EmbodiedFlow.launch(spec, fixed_plan(placement, workflow,
                                                    pipeline_stages=cfg.env.pipeline_stages))

    def measure(batch_sizes: Sequence[int]) -> Profile:
        linked = cfg.placement.num_devices >= 2
        probe = PlacementConfig(spec="env, actor: 0, rollout: 1" if linked else "collocated",
                                num_devices=2 if linked else 1)
        with launched(probe) as flow:
            profile = flow.measure(batch_sizes=batch_sizes, repeats=PROFILE_REPEATS,
                                   probe_iterations=PROBE_ITERATIONS,
                                   data_parallel=2 if linked else 1)
        if linked:  # the hand-overs, where no message crosses (`EmbodiedFlow.probe`)
            with launched(PlacementConfig(spec="collocated", num_devices=1)) as flow:
                profile = profile.merge(flow.probe(PROBE_ITERATIONS))
        return profile

    return measure


def _probed(spec: EmbodiedSpec, cfg: AppConfig, plan: ExecutionPlan) -> Profile:
    """The profile of a throw-away flow of `plan`, with the real iterations that calibrate
    its link when it has one, or its hand-overs when its policy is inline (and env and
    policy timed on two processes at once when the plan spreads either over devices): the
    training flow itself must not run extra iterations."""
    from rlinf_embodied.flow import EmbodiedFlow

    spread = max(len(plan.placement.devices_of(name)) for name in ("env", "rollout"))
    with EmbodiedFlow.launch(spec, plan) as probe:
        return probe.measure(batch_sizes=profile_batch_sizes(cfg.env.num_envs,
                                                             cfg.env.pipeline_stages),
                             repeats=PROFILE_REPEATS,
                             probe_iterations=PROBE_ITERATIONS,
                             data_parallel=2 if spread >= 2 else 1)


def _choose(cfg: AppConfig, spec: EmbodiedSpec, *, cache: ProfileCache | None = None,
            out: TextIO | None = None) -> tuple[PlanChoice, Workflow, Cluster]:
    from rlinf_embodied.workflow import embodied_workflow

    workflow = embodied_workflow(spec)
    cluster = cluster_for(cfg.placement)
    measure = reusing(cache, cfg, workflow, cluster, _profiling_flow(spec, cfg, workflow),
                      out=out)
    choice = choose_plan(cfg, workflow, cluster, measure=measure)
    return choice, workflow, cluster


def _resumed_choice(spec: EmbodiedSpec, cfg: AppConfig, stored: Mapping[str, Any]
                    ) -> tuple[PlanChoice, Workflow, Cluster]:
    from rlinf_embodied.workflow import embodied_workflow

    chosen = ExecutionPlan.from_dict(stored)
    return (PlanChoice(chosen, (chosen,), None, None, 0.0), embodied_workflow(spec),
            cluster_for(cfg.placement))


def dry_run(cfg: AppConfig) -> str:
    """The plan the run would use (for `auto`: profiles briefly, returns the ranked plans)."""
    spec = build_spec(cfg)
    if cfg.placement.spec.strip() == "auto":
        cache = usable_cache(cfg)  # a bad folder is refused before Ray starts
        said = io.StringIO()
        with _ray_session(cfg):
            choice, _, _ = _choose(cfg, spec, cache=cache, out=said)
        done = "planned" if said.getvalue() else "profiled and planned"  # said: reused
        head = (f"{said.getvalue()}plan (auto: {done} in {choice.profile_seconds:.1f} s; "
                "the M2Flow planner's ranked plans, * = chosen):")
    else:
        choice, _, _ = _choose(cfg, spec)
        head = "plan (fixed placement; predicted times need a profile: placement=auto):"
    return f"{head}\n{format_plans(choice)}"


@dataclass
class _Progress:
    """What a checkpoint carries besides the flow's own state."""

    step: int = 0
    env_steps: int = 0
    wall_seconds: float = 0.0
    iteration_seconds: list[float] = field(default_factory=list)
    before: dict[str, Any] = field(default_factory=dict)
    onloads: list[int] = field(default_factory=list)
    """The device lock's onloads in each iteration of this session."""

    def meta(self, cfg: AppConfig, choice: PlanChoice) -> dict[str, Any]:
        return {"config": to_dict(cfg), "step": self.step, "env_steps": self.env_steps,
                "wall_seconds": self.wall_seconds,
                "iteration_seconds": self.iteration_seconds, "before": self.before,
                "plan": choice.plan.to_dict()}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> _Progress:
        return cls(step=int(meta["step"]), env_steps=int(meta["env_steps"]),
                   wall_seconds=float(meta["wall_seconds"]),
                   iteration_seconds=[float(s) for s in meta["iteration_seconds"]],
                   before=dict(meta["before"]))


def _eval_metrics(result: EvalResult) -> dict[str, float]:
    out = {"eval_return": result.mean_return}
    if result.success_rate is not None:
        out["eval_success_rate"] = result.success_rate
    return out


def _existing_run(run_dir: Path) -> bool:
    return (run_dir / "metrics.jsonl").exists() or any((run_dir / CHECKPOINT_DIR).glob("step-*"))


def train(cfg: AppConfig, *, resume: bool = False, stream: TextIO | None = None,
          ray_started: bool = False, overrides: Sequence[str] = ()) -> RunSummary:
    """Run (or resume) training as the config says; returns and prints the summary. A worker
    that dies restarts the run from its last checkpoint up to `run.max_restarts` times
    (module docstring); after that its `WorkerDiedError` propagates. `ray_started`: the
    caller started the Ray this process is connected to (`ray_options`) for this run, which
    the first session then owns (stops at its end). `overrides` go into the run folder's
    ``config.json`` beside the config."""
    out = stream or sys.stdout
    owned = [ray_started]

    def session(again: bool, restarts: tuple[str, ...]) -> RunSummary:
        owns, owned[0] = owned[0], False
        return _train(cfg, resume=again, out=out, restarts=restarts, owns_ray=owns,
                      overrides=overrides)

    return with_restarts(
        session,
        resume=resume, max_restarts=cfg.run.max_restarts, out=out, unit="iteration",
        checkpoints=CheckpointStore(Path(cfg.run.run_dir) / CHECKPOINT_DIR,
                                    keep=cfg.run.keep_checkpoints))


def _train(cfg: AppConfig, *, resume: bool, out: TextIO, restarts: tuple[str, ...],
           owns_ray: bool = False, overrides: Sequence[str] = ()) -> RunSummary:
    """One session of `train`: launch, loop until a worker dies or the run is done.
    `owns_ray`: this session stops the Ray its caller started for it, whatever happens."""
    try:
        return _session(cfg, resume=resume, out=out, restarts=restarts, overrides=overrides)
    finally:
        if owns_ray:
            stop_ray()


def _session(cfg: AppConfig, *, resume: bool, out: TextIO, restarts: tuple[str, ...],
             overrides: Sequence[str] = ()) -> RunSummary:
    run_dir = Path(cfg.run.run_dir)
    if not resume and _existing_run(run_dir):
        raise ConfigError(f"run directory {run_dir} already holds a run: pass --resume to "
                          "continue it or choose a new --run-dir (nothing was overwritten)")
    store = CheckpointStore(run_dir / CHECKPOINT_DIR, keep=cfg.run.keep_checkpoints)
    write_run_config(run_dir, _flatten(to_dict(cfg)), overrides)
    latest = store.latest() if resume else None
    if latest is not None:
        check_resumable(latest[2]["config"], cfg, path=str(latest[1]))
    elif resume:
        print(f"no checkpoint in {run_dir / CHECKPOINT_DIR}: starting from scratch", file=out)
    spec = build_spec(cfg)
    cache = usable_cache(cfg)  # a bad folder is refused before Ray starts
    with _ray_session(cfg):
        if latest is not None and "plan" in latest[2]:
            # The checkpoint's stage groups are part of its state: keep its plan (an `auto`
            # run is not profiled again, which could pick other stage groups).
            choice, workflow, cluster = _resumed_choice(spec, cfg, latest[2]["plan"])
        else:
            choice, workflow, cluster = _choose(cfg, spec, cache=cache, out=out)
            choice = tried_choice(cfg, spec, workflow, cluster, choice, out=out)
        from rlinf_embodied.flow import EmbodiedFlow

        if cfg.run.trace and choice.cost is None:  # price the fixed plan for its Gantt
            choice = priced(choice, _probed(spec, cfg, choice.plan), workflow, cluster)
        if choice.profile is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            choice.profile.save(run_dir / PROFILE_FILE)
        # Closed with a kill after a failure: ranks may be stuck, the cluster gone.
        with EmbodiedFlow.launch(spec, choice.plan, cluster=cluster,
                                 trace=cfg.run.trace) as flow:
            if not math.isnan(choice.plan.predicted_time):
                print(f"plan: [{choice.plan.mode.value}] {choice.plan.spec}; the planner "
                      f"predicts {choice.plan.predicted_time:.3f} s/iteration", file=out)
            summary = _loop(cfg, flow, choice=choice, workflow=workflow, cluster=cluster,
                            store=store, latest=latest, resuming=resume, out=out,
                            restarts=restarts)
    print(summary.format(), file=out)
    return summary


def _loop(cfg: AppConfig, flow: EmbodiedFlow, *, choice: PlanChoice, workflow: Workflow,
          cluster: Cluster, store: CheckpointStore, latest: tuple[int, Path, dict[str, Any]] | None,
          resuming: bool, out: TextIO, restarts: tuple[str, ...] = ()) -> RunSummary:
    run, run_dir = cfg.run, Path(cfg.run.run_dir)
    eval_seed = run.seed + EVAL_SEED_OFFSET
    if latest is not None:
        flow.load(latest[1])
        progress = _Progress.from_meta(latest[2])
        print(f"resumed from {latest[1]} (step {progress.step})", file=out)
    else:
        progress = _Progress()
    spans: list[Span] = []
    # Records past the checkpoint are redone; resuming without one redoes everything.
    resume_step = progress.step + 1 if latest is not None else (0 if resuming else None)
    with metrics_writer(run_dir, run.loggers, resume_step=resume_step,
                        config=_flatten(to_dict(cfg))) as metrics:
        if latest is None:
            before = flow.evaluate(num_episodes=run.eval_episodes, seed=eval_seed,
                                   max_steps=run.eval_max_steps)
            progress.before = _eval_metrics(before)
            metrics.write(0, progress.before)
        if restarts:
            metrics.write(progress.step, {"run/restarts": float(len(restarts))})
        display = ProgressDisplay(run.iterations, desc=cfg.env.id, start=progress.step,
                                  stream=out, keys=("episode_return", "success_rate",
                                                    "env_steps_per_s", "eval_return"))
        segment_start = progress.step
        last_eval: dict[str, float] = {}
        try:
            for step in range(progress.step + 1, run.iterations + 1):
                started = time.perf_counter()
                checkpoint = step == run.iterations or bool(
                    run.checkpoint_every and step % run.checkpoint_every == 0)
                # With a policy lag, a checkpoint (and the end) trains the last rollout
                # first: nothing is in flight when the state is saved.
                result = flow.step(step, drain=checkpoint)
                record = dict(result.metrics)
                progress.env_steps += result.env_steps
                progress.iteration_seconds.append(result.seconds)
                progress.onloads.append(result.onloads)
                record["env_steps"] = progress.env_steps
                if run.trace and step - segment_start <= _TRACE_ITERATIONS:
                    spans.extend(result.spans)
                metrics.write(step, record)
                if run.eval_every and step % run.eval_every == 0 and step != run.iterations:
                    last_eval = _eval_metrics(flow.evaluate(
                        num_episodes=run.eval_episodes, seed=eval_seed,
                        max_steps=run.eval_max_steps))
                    metrics.write(step, last_eval)
                display.update(step, record | last_eval)
                progress.step = step
                progress.wall_seconds += time.perf_counter() - started
                if checkpoint:
                    store.save(step, flow.save, meta=progress.meta(cfg, choice))
        finally:
            display.close()
        final = flow.evaluate(num_episodes=run.eval_episodes, seed=eval_seed,
                              max_steps=run.eval_max_steps, record_video=run.video)
        after = _eval_metrics(final)
        if progress.step == run.iterations and not _has_final_eval(run_dir, run.iterations):
            metrics.write(run.iterations, after)
    _write_outputs(cfg, final, spans, choice=choice, workflow=workflow, cluster=cluster,
                   out=out)
    return _summarise(cfg, choice, progress, after, restarts=restarts)


def _has_final_eval(run_dir: Path, step: int) -> bool:
    return any(r.get("step") == step and "eval_return" in r
               for r in read_metrics(run_dir / "metrics.jsonl"))


def _write_outputs(cfg: AppConfig, final: EvalResult, spans: Sequence[Span], *,
                   choice: PlanChoice, workflow: Workflow, cluster: Cluster,
                   out: TextIO) -> None:
    run_dir = Path(cfg.run.run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    ys = [y for y in ("episode_return", "eval_return", "success_rate", "eval_success_rate")
          if any(y in r for r in records)]
    plot_learning_curve(records, ys=ys, path=run_dir / "learning_curve.png",
                        title=f"{cfg.env.id} ({cfg.algorithm.name})")
    if cfg.run.video and final.frames is not None and len(final.frames):
        write_video(final.frames, run_dir / "eval.gif", fps=30)
    if cfg.run.trace and spans:
        predicted: list[Span] = []
        sim = choice.simulation
        if sim is None and choice.cost is not None:
            sim = simulate_plan(choice.plan, workflow, choice.cost, cluster)
        if sim is not None:
            origin = min(s.start for s in spans)
            predicted = predicted_spans(sim, origin=origin)
        write_chrome_trace(run_dir / "trace.json", spans, predicted=predicted)
        plot_timeline(run_dir / "timeline.png", spans, predicted)
        print(f"trace: {run_dir / 'trace.json'} (chrome://tracing or ui.perfetto.dev), "
              f"timeline: {run_dir / 'timeline.png'}", file=out)


def _steady_median(values: Sequence[float]) -> float:
    """The median over steady iterations: all but the first (warm-up, first onloads) when
    there are several; NaN for none."""
    steady = values[1:] if len(values) > 1 else values
    return float(statistics.median(steady)) if steady else math.nan


def _summarise(cfg: AppConfig, choice: PlanChoice, progress: _Progress,
               after: Mapping[str, float], *, restarts: tuple[str, ...] = ()) -> RunSummary:
    run = cfg.run
    before = progress.before
    success_after = after.get("eval_success_rate")
    reached = target_reached(mean_return=after["eval_return"], success_rate=success_after,
                             target_return=run.target_return,
                             target_success_rate=run.target_success_rate)
    predicted = choice.plan.predicted_time
    seconds = progress.wall_seconds
    summary = RunSummary(
        task=cfg.env.id, algorithm=cfg.algorithm.name, mode=choice.plan.mode.value,
        placement=choice.plan.spec, iterations=progress.step,
        eval_return_before=float(before.get("eval_return", math.nan)),
        eval_return_after=after["eval_return"],
        success_before=before.get("eval_success_rate"), success_after=success_after,
        target_return=run.target_return, target_success_rate=run.target_success_rate,
        target_reached=reached, wall_seconds=seconds, env_steps=progress.env_steps,
        env_steps_per_s=progress.env_steps / seconds if seconds > 0 else 0.0,
        measured_iteration_s=_steady_median(progress.iteration_seconds),
        predicted_iteration_s=None if math.isnan(predicted) else predicted,
        run_dir=str(Path(run.run_dir)),
        simulated_switches=choice.simulation.switches if choice.simulation else None,
        lock_switches_per_iteration=(_steady_median(progress.onloads)
                                     if progress.onloads else None),
        restarts=restarts, policy_lag=cfg.algorithm.policy_lag,
        trials=tuple(trial.to_dict() for trial in choice.trials))
    summary.save(Path(run.run_dir) / "summary.json")
    return summary
