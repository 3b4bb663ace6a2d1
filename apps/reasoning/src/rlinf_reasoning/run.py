"""The training loop of ``rlinf-reasoning``, top to bottom.

    config → problems (pure function of seed and step) → FlowSpec → profile (probe runs,
    or the profile cache) → execution plan (a fixed placement priced from the profile, or
    auto: fit → plan) → launch the flow → held-out greedy
    accuracy before → for each step: flow.step → metrics (JSONL + TensorBoard) → progress
    → held-out accuracy every `eval_every` → checkpoint every `checkpoint_every`
    → learning curve, trace, summary

Resuming (`train(..., resume=True)`) reloads the latest checkpoint of the run folder after
checking that it was written with the same config (except ``run.steps``), keeps its
execution plan, drops the metric records of steps that are about to be redone and continues
from the next step with the same problems and random draws, so the metrics equal those of an
uninterrupted run.

Self-healing (``run.max_restarts``): when a worker dies, the flow has already torn down
what was left; `train` records the restart and resumes itself as above (from the start when
no checkpoint was taken yet), at most ``max_restarts`` times. Restarts are written to the
metrics (``run/restarts`` and ``run/devices`` at the step the run went on from) and to the
summary. Each session discovers the cluster afresh: when a node was lost (its raylet died)
and the checkpoint's plan names devices the cluster no longer has, the run is planned again
for the devices that remain (the configured placement resolved for them, or ``auto``'s
profile and plan), and the restart's line in the summary says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import structlog

from rlinf.sched import (
    Cluster,
    ExecutionPlan,
    Profile,
    ProfileCache,
    Replan,
    Replanner,
    profile_key,
    switch_pays,
)
from rlinf.workers import flow as rf
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import PROFILE_FORMAT, ensure_ray, with_restarts
from rlinf.workers.runtime.ray_session import stop_ray
from rlinf.workers.telemetry import (
    CONFIG_FILE,
    CheckpointStore,
    ProgressDisplay,
    Span,
    metrics_writer,
    read_metrics,
    write_run_config,
)
from rlinf_reasoning.banner import describe_loaded
from rlinf_reasoning.config import ReasoningConfig, config_dict
from rlinf_reasoning.data import ProblemSource
from rlinf_reasoning.errors import ResumeError
from rlinf_reasoning.export import export_checkpoint
from rlinf_reasoning.flow import Evaluation, ReasoningFlow
from rlinf_reasoning.planning import (
    PlanChoice,
    auto_plan,
    describe_plan,
    first_guess,
    format_plans,
    planned_fixed,
    predict,
    replanner,
)
from rlinf_reasoning.report import (
    HELDOUT_KEY,
    Summary,
    print_summary,
    steady_median,
    write_curve,
    write_summary,
    write_trace,
)
from rlinf_reasoning.resume import CHECKPOINT_DIR, Checkpoint, checkpoint_meta, find_resume_point
from rlinf_reasoning.spec import FlowSpec, flow_spec
from rlinf_reasoning.trials import tried_choice
from rlinf_reasoning.workflow import reasoning_workflow

__all__ = ["CONFIG_FILE", "PLAN_FILE", "PROFILE_FILE", "dry_run", "train"]

_log = structlog.get_logger(__name__)

HF_EXPORT_DIR = "hf"
"""Folder of the Hugging Face exports of checkpoints (``run.export_hf``)."""
"""The resolved config and the overrides, in the run folder."""
PROFILE_FILE = "profile.json"
"""The measured profile the plan was priced with (reused on resume)."""
PLAN_FILE = "plan.json"
"""``auto``: the planner's ranked plans."""
METRICS_FILE = "metrics.jsonl"
PROGRESS_KEYS = ("reward/accuracy", HELDOUT_KEY, "time/step")


def _cluster(cfg: ReasoningConfig) -> Cluster:
    return Cluster.discover(use_ray=True, cpu_slots=cfg.cluster.cpu_slots)


def choose_plan(cfg: ReasoningConfig, spec: FlowSpec, cluster: Cluster, source: ProblemSource,
                *, out: TextIO, trials: bool = True) -> PlanChoice:
    """The plan to launch, chosen without delaying the run: a fixed placement's plan, or
    ``auto``'s. With a profile measured before for this workflow, model and cluster
    (``run.profile_cache``), a fixed plan is priced from it (unless ``run.predict=false``)
    and ``auto`` plans from it (printing the ranked plans to `out`; with `trials`, the
    fastest as measured of those priced close to the best: `rlinf_reasoning.trials`).
    Without one, nothing is profiled before the run: a fixed plan starts unpriced and
    ``auto`` starts collocated (the first guess), each marked ``live``: `_loop` prices the
    plan from the run's own first steps and caches what the run measured, so the next run
    of the same setting is priced and planned before it starts."""
    auto = cfg.placement.strip().lower() == "auto"
    if not auto and not cfg.run.predict:
        return PlanChoice(plan=planned_fixed(cfg, spec, cluster.num_devices))
    label = "auto" if auto else "predict"
    cache = _profile_cache(cfg)
    profile = None if cache is None else cache.load(_profile_key(cfg, spec, cluster))
    if profile is None or not profile.measurements:
        plan = (planned_fixed(cfg, spec, cluster.num_devices) if not auto
                else first_guess(cfg, spec, cluster))
        why = "no profile of this workflow, model and cluster is cached" if cache is not None \
            else "run.profile_cache is off"
        start = "starting collocated (the first guess)" if auto else "starting at once"
        print(f"{label}: {why}: {start}, priced from the run's own first steps"
              f"{' and cached for the next run' if cache is not None else ''}",
              file=out, flush=True)
        return PlanChoice(plan=plan, live=True)
    print(f"{label}: priced from the profile measured before for this workflow, model and "
          f"cluster ({cache.path(_profile_key(cfg, spec, cluster)) if cache else ''})",
          file=out, flush=True)
    if not auto:
        plan, simulation = predict(planned_fixed(cfg, spec, cluster.num_devices), spec,
                                   profile, cluster)
        return PlanChoice(plan=plan, profile=profile, simulation=simulation)
    choice = auto_plan(spec, profile, cluster)
    if choice.ranked is not None:
        format_plans(choice.ranked, out)
    return tried_choice(cfg, spec, cluster, source, choice, out=out) if trials else choice


def _profile_cache(cfg: ReasoningConfig) -> ProfileCache | None:
    """``run.profile_cache`` (None when off), its folder created or refused at once."""
    if cfg.run.profile_cache is None:
        return None
    cache = ProfileCache(cfg.run.profile_cache)
    try:  # refuse an unusable folder before the run, not after it
        cache.directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"run.profile_cache={cfg.run.profile_cache!r}: cannot create that "
                          f"folder ({exc}); give a writable folder or null") from exc
    return cache


def _profile_key(cfg: ReasoningConfig, spec: FlowSpec, cluster: Cluster) -> str:
    return profile_key(workflow=reasoning_workflow(spec), cluster=cluster,
                       model=_profile_identity(cfg))


def _cache_run_profile(cfg: ReasoningConfig, spec: FlowSpec, cluster: Cluster,
                       measured: Profile) -> None:
    """Add what a run measured of itself to the profile cache (merged with what is there;
    a cache that cannot be written is logged and skipped: the run has what it needs)."""
    cache = _profile_cache(cfg)
    if cache is None:
        return
    key = _profile_key(cfg, spec, cluster)
    try:
        cache.save(key, rf.merge_run_profiles(cache.load(key), measured))
    except OSError as exc:
        _log.warning("profile_cache_store_failed", directory=str(cache.directory),
                     error=str(exc))


def _profile_identity(cfg: ReasoningConfig) -> dict[str, object]:
    """What a component's cost depends on besides the workflow and the cluster: every
    setting but the run's (its length, seed, outputs: jobs of a sweep over seeds share one
    profile), and the versions of the code that runs it."""
    import torch
    import transformers

    flat = {k: v for k, v in config_dict(cfg).items() if not k.startswith("run.")}
    return {**flat, "torch": torch.__version__, "transformers": transformers.__version__,
            "profile_format": PROFILE_FORMAT}


def dry_run(cfg: ReasoningConfig, *, out: TextIO = sys.stdout) -> PlanChoice:
    """Print the plan the run would launch; for ``auto``, profile and print the ranked plans.

    Fixed placements start nothing; ``auto`` starts Ray and a short profiling flow, but never
    trains.
    """
    spec = flow_spec(cfg)
    if cfg.placement.strip().lower() != "auto":
        from rlinf_reasoning.config import cluster_size

        choice = PlanChoice(plan=planned_fixed(cfg, spec, cluster_size(cfg)))
        describe_plan(choice.plan, out, predicted=False)
        print("  (predicted iteration time: profiled when the run starts)", file=out)
        return choice
    owns_ray = ensure_ray()
    try:
        # A dry run trains nothing, not even throw-away trials.
        choice = choose_plan(cfg, spec, _cluster(cfg), ProblemSource(cfg), out=out,
                             trials=False)
    finally:
        if owns_ray:
            stop_ray()
    describe_plan(choice.plan, out, predicted=True)
    return choice


@dataclass(frozen=True)
class _Session:
    """What one invocation of `train` works with."""

    cfg: ReasoningConfig
    spec: FlowSpec
    cluster: Cluster
    source: ProblemSource
    run_dir: Path
    store: CheckpointStore
    ckpt: Checkpoint | None
    overrides: tuple[str, ...]
    started: float
    out: TextIO
    restarts: tuple[str, ...] = ()
    """What each earlier restart of this run recovered from (``run.max_restarts``)."""
    launch_seconds: float = 0.0
    """How long this session's launch took: what a relaunch on another plan costs."""


def _check_run_dir(run_dir: Path, store: CheckpointStore, cfg: ReasoningConfig,
                   resume: bool, *, restarting: bool = False) -> Checkpoint | None:
    if restarting and store.latest() is None:
        return None  # died before the first checkpoint: start over (metrics are redone)
    if not resume:
        if (run_dir / METRICS_FILE).exists() or store.latest() is not None:
            raise ResumeError(f"run folder {run_dir} already holds a run: pass --resume to "
                              "continue it, or choose another --run-dir")
        return None
    ckpt = find_resume_point(store, cfg)
    if ckpt.step >= cfg.run.steps:
        raise ResumeError(f"the latest checkpoint in {run_dir} is at step {ckpt.step}, and "
                          f"run.steps={cfg.run.steps}: nothing to do; raise run.steps to train "
                          "longer")
    return ckpt


def _write_config(run_dir: Path, cfg: ReasoningConfig, overrides: Sequence[str]) -> None:
    write_run_config(run_dir, config_dict(cfg), overrides)


def train(cfg: ReasoningConfig, *, resume: bool = False, overrides: Sequence[str] = (),
          out: TextIO = sys.stdout, ray_started: bool = False) -> Summary:
    """Run (or resume) training as `cfg` says; prints and returns the summary. A worker that
    dies restarts the run from its last checkpoint up to ``run.max_restarts`` times (module
    docstring); after that its `WorkerDiedError` propagates. `ray_started`: the caller
    started the Ray this process is connected to for this run, which the first session then
    owns (stops at its end, before the summary), as one it started itself."""
    owned = [ray_started]

    def session(again: bool, restarts: tuple[str, ...]) -> Summary:
        owns, owned[0] = owned[0], False
        return _train(cfg, resume=again, overrides=overrides, out=out, restarts=restarts,
                      owns_ray=owns)

    return with_restarts(
        session,
        resume=resume, max_restarts=cfg.run.max_restarts, out=out,
        checkpoints=CheckpointStore(Path(cfg.run.run_dir).expanduser() / CHECKPOINT_DIR,
                                    keep=cfg.run.keep_checkpoints))


def _train(cfg: ReasoningConfig, *, resume: bool, overrides: Sequence[str], out: TextIO,
           restarts: tuple[str, ...], owns_ray: bool = False) -> Summary:
    """One session of `train`: launch, loop until a worker dies or the run is done.
    `owns_ray`: this session stops the Ray its caller started for it, whatever happens."""
    started = time.perf_counter()
    try:
        run_dir = Path(cfg.run.run_dir).expanduser()
        run_dir.mkdir(parents=True, exist_ok=True)
        store = CheckpointStore(run_dir / CHECKPOINT_DIR, keep=cfg.run.keep_checkpoints)
        ckpt = _check_run_dir(run_dir, store, cfg, resume, restarting=bool(restarts))
        source = ProblemSource(cfg)
        spec = flow_spec(cfg)
        _write_config(run_dir, cfg, overrides)
        if not restarts:  # a restart loads the same things again
            for line in describe_loaded(cfg, spec, source).lines():
                print(line, file=out)
        owns_ray = ensure_ray() or owns_ray
        session = _Session(cfg=cfg, spec=spec, cluster=_cluster(cfg), source=source,
                           run_dir=run_dir, store=store, ckpt=ckpt, overrides=tuple(overrides),
                           started=started, out=out, restarts=restarts)
        if ckpt is not None:
            if _fits(ckpt.plan, session.cluster):
                choice = _resumed(session, ckpt.plan)
            else:
                choice, session = _replanned_for_lost_devices(session, ckpt.plan)
            print(f"resuming from step {ckpt.step} ({ckpt.path})", file=out)
        else:
            choice = choose_plan(cfg, spec, session.cluster, source, out=out)
            _save_choice(choice, run_dir)
        describe_plan(choice.plan, out, predicted=choice.simulation is not None)
        print("launch: starting the worker processes ...", file=out, flush=True)
        launching = time.perf_counter()
        with ReasoningFlow.launch(spec, choice.plan, problems=source, cluster=session.cluster,
                                  trace=cfg.run.trace) as flow:
            sets = flow.run.flow.process_sets(choice.plan.placement)
            launched = time.perf_counter() - launching
            print(f"launch: {sum(choice.plan.placement.components[s[0]].num_procs for s in sets)}"
                  f" worker process(es) ({'; '.join('+'.join(s) for s in sets)}) ready in "
                  f"{launched:.1f} s", file=out, flush=True)
            summary = _loop(dataclasses.replace(session, launch_seconds=launched), flow, choice)
    finally:
        if owns_ray:
            stop_ray()
    # Printed once the workers and Ray are gone: the process exits right after it.
    print_summary(summary, out)
    _log.info("run_done", **summary.to_dict())
    return summary


SAMPLES_FILE = "samples.jsonl"
"""Held-out responses of each evaluation, one JSON object per line (``run.eval_samples``)."""


def _evaluated(session: _Session, flow: ReasoningFlow, step: int) -> Evaluation:
    """Held-out greedy evaluation at `step`; its first ``run.eval_samples`` responses, with
    their rewards, appended to the run folder's `SAMPLES_FILE`."""
    evaluation = flow.evaluation(session.source.heldout, samples=session.cfg.run.eval_samples)
    if evaluation.samples:
        with (session.run_dir / SAMPLES_FILE).open("a", encoding="utf-8") as out:
            for sample in evaluation.samples:
                out.write(json.dumps({"step": step, **sample}) + "\n")
    return evaluation


def _eval_record(evaluation: Evaluation) -> dict[str, float]:
    """The metrics of a held-out evaluation: accuracy, and the tools' use when there are."""
    return {HELDOUT_KEY: evaluation.accuracy,
            **{f"eval/tool_{key}": value for key, value in evaluation.tools.items()}}


def _replanner(session: _Session, choice: PlanChoice) -> Replanner | None:
    """The run's re-planner (``run.replan``), or None."""
    run = session.cfg.run
    if not run.replan:
        return None
    if choice.profile is None:
        _log.warning("replan_disabled", reason="no measured profile to re-fit (set run.predict)")
        return None
    return replanner(session.spec, choice, session.cluster, threshold=run.replan_threshold,
                     patience=run.replan_patience)


def _close_flows(flows: Sequence[ReasoningFlow]) -> None:
    for flow in flows:
        flow.close()


def _busy(metrics: Mapping[str, float], replan: Replanner) -> dict[str, float]:
    """Each component's busy seconds in the step (the slowest rank's, `time/<role>`)."""
    return {name: metrics[f"time/{name}"] for name in replan.workflow.names
            if f"time/{name}" in metrics}


def _replan_record(decision: Replan) -> dict[str, float]:
    """The metrics a re-plan adds to its step's record."""
    return {"replan/adopted": float(decision.adopted), "replan/measured_s": decision.measured,
            "replan/predicted_before_s": decision.predicted_before,
            "replan/repriced_current_s": decision.repriced_current,
            "replan/predicted_new_s": decision.predicted_new}


def _replan_span(decision: Replan, started: float, ended: float) -> Span:
    """A re-plan decision on the trace's ``driver/replan`` track: the relaunch's span when
    adopted, an instant when not, with what the re-planner measured and predicted."""
    return Span("driver/replan", "replan" if decision.adopted else "replan_rejected",
                started, ended, {"step": decision.iteration, "plan": decision.plan.spec,
                                 **_replan_record(decision)})


def _relaunch(session: _Session, flow: ReasoningFlow, choice: PlanChoice, plan: ExecutionPlan,
              checkpoint: Path) -> tuple[ReasoningFlow, PlanChoice]:
    """Close `flow`, launch `plan` and load the checkpoint just taken (a step boundary)."""
    out = session.out
    print(f"re-plan: {choice.plan.spec} -> {plan.spec} (predicted {plan.predicted_time:.3f} s "
          "per step on the live costs); relaunching from the checkpoint", file=out, flush=True)
    flow.close()
    launched = ReasoningFlow.launch(session.spec, plan, problems=session.source,
                                    cluster=session.cluster, trace=session.cfg.run.trace)
    try:
        launched.load(checkpoint)
    except BaseException:
        launched.close(kill=True)
        raise
    simulation = None
    if choice.profile is not None:
        plan, simulation = predict(plan, session.spec, choice.profile, session.cluster)
    return launched, PlanChoice(plan=plan, ranked=choice.ranked, profile=choice.profile,
                                simulation=simulation, trials=choice.trials)


LIVE_STEPS = 3
"""A plan no profile priced (`PlanChoice.live`) is priced after this many steps of the run
(the first a warm-up), or at its last step when it is shorter."""


def _priced_live(session: _Session, flow: ReasoningFlow, choice: PlanChoice) -> PlanChoice:
    """`choice` priced from what the run measured of itself so far (`rf.run_profile`):
    the simulated iteration of its plan, printed, kept in the run folder for a resume, and
    added to the profile cache."""
    measured = rf.run_profile(flow.run, skip=1 if len(flow.run.records) > 1 else 0)
    plan, simulation = predict(choice.plan, session.spec, measured, session.cluster)
    plan = dataclasses.replace(plan, parallelism=choice.plan.parallelism)  # the cut it runs
    steps = len(flow.run.records)
    print(f"predict: {plan.predicted_time:.3f} s per step for {plan.spec} (priced from the "
          f"components this run measured in its first {steps} step(s))", file=session.out,
          flush=True)
    priced = dataclasses.replace(choice, plan=plan, profile=measured, simulation=simulation,
                                 live=False)
    _save_choice(priced, session.run_dir)
    _cache_run_profile(session.cfg, session.spec, session.cluster, measured)
    return priced


LIVE_MIN_GAIN = 0.05
"""``auto`` leaves its first guess for a plan its live costs price at least this much faster
(relative), and goes back when the first guess measured that much faster."""


def _live_switch(session: _Session, choice: PlanChoice, *,
                 steps_left: int) -> ExecutionPlan | None:
    """``auto`` on its first guess, priced from its own steps: the plan those costs price
    fastest (`auto_plan`), when moving to it pays for a relaunch over the steps left
    (`rlinf.sched.switch_pays`); None to stay. No planning at all when even a plan of no
    cost could not save a relaunch over the steps left."""
    if session.cfg.placement.strip().lower() != "auto" or choice.profile is None:
        return None
    current = choice.plan.predicted_time
    if not switch_pays(current, current * 1e-9, steps_left=steps_left,
                       switch_s=session.launch_seconds, min_gain=LIVE_MIN_GAIN):
        return None  # not even a plan of no cost would pay for a relaunch: no planning
    best = auto_plan(session.spec, choice.profile, session.cluster).plan
    if (best.spec, dict(best.granularity)) == (choice.plan.spec, dict(choice.plan.granularity)):
        return None
    pays = switch_pays(current, best.predicted_time, steps_left=steps_left,
                       switch_s=session.launch_seconds, min_gain=LIVE_MIN_GAIN)
    print(f"auto: {best.spec} is priced at {best.predicted_time:.3f} s per step against "
          f"{current:.3f} for {choice.plan.spec}: "
          + (f"trying it for {LIVE_STEPS} steps" if pays else
             f"not worth a relaunch ({session.launch_seconds:.1f} s) over the {steps_left} "
             "steps left"), file=session.out, flush=True)
    return best if pays else None


def _kept_faster(session: _Session, choice: PlanChoice, tried: tuple[PlanChoice, float], *,
                 measured: float, steps_left: int) -> ExecutionPlan | None:
    """``auto`` tried `choice` for as many steps as the plan it left ran: that plan again
    when it measured faster (and going back pays), None to keep `choice`."""
    previous, previous_s = tried
    back = switch_pays(measured, previous_s, steps_left=steps_left,
                       switch_s=session.launch_seconds, min_gain=LIVE_MIN_GAIN)
    print(f"auto: {choice.plan.spec} measured {measured:.3f} s per step against "
          f"{previous_s:.3f} for {previous.plan.spec}: "
          f"{'going back' if back else 'keeping it'}", file=session.out, flush=True)
    return previous.plan if back else None


def _save_choice(choice: PlanChoice, run_dir: Path) -> None:
    """Keep the profile the plan was priced with (a resume prices from it) and the ranks."""
    if choice.profile is not None:
        choice.profile.save(run_dir / PROFILE_FILE)
    if choice.ranked is not None:
        choice.ranked.save(run_dir / PLAN_FILE)


def _fits(plan: ExecutionPlan, cluster: Cluster) -> bool:
    """Whether every device `plan` places a component on exists in `cluster`."""
    return all(device < cluster.num_devices for comp in plan.placement for device in comp.devices)


def _replanned_for_lost_devices(session: _Session,
                                plan: ExecutionPlan) -> tuple[PlanChoice, _Session]:
    """A plan for the devices that remain (a node was lost since `plan` was chosen), and the
    session whose last restart line says so."""
    cluster, out = session.cluster, session.out
    used = 1 + max(d for comp in plan.placement for d in comp.devices)
    print(f"the checkpoint's plan ({plan.spec}) uses {used} device(s) and the cluster has "
          f"{cluster.num_devices} left: planning again", file=out, flush=True)
    choice = choose_plan(session.cfg, session.spec, cluster, session.source, out=out)
    _save_choice(choice, session.run_dir)
    note = f"re-planned for the {cluster.num_devices} device(s) left: {choice.plan.spec}"
    _log.warning("replanned_for_lost_devices", before=plan.spec, after=choice.plan.spec,
                 devices=cluster.num_devices)
    restarts = session.restarts
    if restarts:
        restarts = (*restarts[:-1], f"{restarts[-1]}; {note}")
    return choice, dataclasses.replace(session, restarts=restarts)


def _resumed(session: _Session, plan: ExecutionPlan) -> PlanChoice:
    """The checkpoint's plan, priced again from the run's saved profile if it has one."""
    path = session.run_dir / PROFILE_FILE
    if not (session.cfg.run.predict and path.is_file()):
        return PlanChoice(plan=plan)
    profile = Profile.load(path)
    priced, simulation = predict(plan, session.spec, profile, session.cluster)
    priced = dataclasses.replace(priced, parallelism=plan.parallelism)  # the cut it resumes
    return PlanChoice(plan=priced, profile=profile, simulation=simulation)


def _loop(session: _Session, flow: ReasoningFlow, choice: PlanChoice) -> Summary:
    cfg, ckpt, run_dir = session.cfg, session.ckpt, session.run_dir
    run = cfg.run
    if ckpt is not None:
        flow.load(ckpt.path)
        before, start, prior_seconds = ckpt.heldout_before, ckpt.step, ckpt.seconds
        tools_before: dict[str, float] = {}
    else:
        first = _evaluated(session, flow, 0)
        before, start, prior_seconds = first.accuracy, 0, 0.0
        tools_before = dict(first.tools)
    after, tools_after = before, tools_before
    replan = _replanner(session, choice)
    relaunched: list[ReasoningFlow] = []
    plan_from = start
    """The step after which the current plan started (a relaunch moves it)."""
    tried: tuple[PlanChoice, float] | None = None
    """``auto``: the plan it left for the one its live costs priced faster, and that plan's
    measured seconds per step, until the new one has run as long (`_kept_faster`)."""
    step_seconds: list[float] = []
    onloads: list[float] = []
    samples = 0
    cached = 1
    """The flow's records the profile cache has (its first, a warm-up, never)."""
    spans: list[Span] = []
    last_spans: list[Span] = []
    loop_start = time.perf_counter()
    redo_from = start + 1 if ckpt is not None else (0 if session.restarts else None)
    with metrics_writer(run_dir, run.loggers, resume_step=redo_from,
                        config=config_dict(session.cfg)) as writer, \
            ProgressDisplay(run.steps, desc="train", start=start, keys=PROGRESS_KEYS) as progress, \
            contextlib.ExitStack() as flows:
        flows.callback(_close_flows, relaunched)
        if ckpt is None:
            writer.write(0, _eval_record(first))
        if session.restarts:
            writer.write(start, {"run/restarts": float(len(session.restarts)),
                                 "run/devices": float(session.cluster.num_devices)})
        for step in range(start + 1, run.steps + 1):
            # With a policy lag (never with replan) a checkpoint step, and the last, trains
            # its own responses too: no step is in flight when the state is saved.
            due = step == run.steps or bool(run.checkpoint_every
                                            and step % run.checkpoint_every == 0)
            result = flow.step(step, drain=due)
            record = {**result.metrics, "rollout/samples": float(result.samples),
                      "rollout/tokens": float(result.tokens)}
            step_seconds.append(result.seconds)
            onloads.append(result.onloads)
            samples += result.samples
            if result.spans:
                last_spans = list(result.spans)
                spans.extend(result.spans)
            if step == run.steps or (run.eval_every and step % run.eval_every == 0):
                evaluation = _evaluated(session, flow, step)
                after, tools_after = evaluation.accuracy, dict(evaluation.tools)
                record.update(_eval_record(evaluation))
            decision = None if replan is None else replan.observe(
                step, seconds=result.seconds, busy=_busy(result.metrics, replan))
            if decision is not None:
                record.update(_replan_record(decision))
            writer.write(step, record)
            progress.update(step, record)
            target = decision.plan if decision is not None and decision.adopted else None
            on_plan = step_seconds[plan_from - start:]  # this plan's steps, its first a warm-up
            if choice.live and (step - plan_from == LIVE_STEPS or step == run.steps):
                choice = _priced_live(session, flow, choice)
                cached = max(cached, len(flow.run.records))
                live = None if target is not None else _live_switch(
                    session, choice, steps_left=run.steps - step)
                if live is not None:
                    target, tried = live, (choice, steady_median(on_plan) or result.seconds)
            elif tried is not None and step - plan_from == LIVE_STEPS:
                target = _kept_faster(session, choice, tried, measured=steady_median(on_plan)
                                      or result.seconds, steps_left=run.steps - step)
                tried = None
            switch = target is not None and step < run.steps
            if switch or step == run.steps or (run.checkpoint_every
                                               and step % run.checkpoint_every == 0):
                seconds = prior_seconds + time.perf_counter() - loop_start
                path = session.store.save(step, flow.save, meta=checkpoint_meta(
                    cfg, step=step, heldout_before=before,
                    plan=target if target is not None and switch else choice.plan,
                    seconds=seconds, overrides=session.overrides))
                if run.export_hf:
                    export_checkpoint(session.run_dir, session.run_dir / HF_EXPORT_DIR /
                                      f"step-{step:08d}", step=step)
            decided = time.time()
            if target is not None and switch:
                flow, choice = _relaunch(session, flow, choice, target, path)
                relaunched.append(flow)
                plan_from, cached = step, 1
            if decision is not None and run.trace:
                spans.append(_replan_span(decision, decided, time.time() if switch else decided))
    wall = prior_seconds + time.perf_counter() - loop_start
    if len(flow.run.records) > cached:  # the next run of the setting is priced before it starts
        _cache_run_profile(cfg, session.spec, session.cluster,
                           rf.run_profile(flow.run, skip=cached))
    records = read_metrics(run_dir / METRICS_FILE)
    write_curve(records, run_dir)
    if run.trace and spans:
        write_trace(run_dir, spans, last_spans, choice.simulation)
    summary = Summary(
        heldout_before=before, heldout_after=after, steps=run.steps, wall_seconds=wall,
        total_seconds=time.perf_counter() - session.started, samples=samples,
        samples_per_s=samples / sum(step_seconds) if step_seconds else 0.0,
        mode=choice.plan.mode.value, placement=choice.plan.spec,
        predicted_iteration_s=choice.plan.predicted_time if choice.simulation else None,
        measured_iteration_s=steady_median(step_seconds[plan_from - start:]),  # final plan
        simulated_switches=choice.simulation.switches if choice.simulation else None,
        lock_switches_per_iteration=steady_median(onloads), restarts=session.restarts,
        parallelism=choice.plan.parallelism,
        trials=tuple(trial.to_dict() for trial in choice.trials), tools_before=tools_before,
        tools_after=tools_after)
    write_summary(summary, run_dir)
    return summary
