"""How a run chooses, prices and changes its plan, without delaying its start.

- `choose_plan`: a fixed placement's plan, or ``auto``'s. With a profile measured before for
  this workflow, model and cluster (the profile cache), a fixed plan is priced from it and
  ``auto`` ranks plans from it (and tries those priced close to the best). Without one,
  nothing is profiled before the run: a fixed plan starts unpriced and ``auto`` starts on
  its first guess, both marked ``live``.
- `priced_live`: a ``live`` plan priced from the run's own first iterations
  (`rlinf.workers.flow.auto.run_profile`), saved in the run folder and the cache, so the next
  run of the setting is priced before it starts. A run long enough is priced again from the
  iterations after those (the first still warm up and run slower than the steady state the
  prediction is for), then from all of them after twice as many and at its last; the cache
  keeps those at the end.
- `live_switch` / `kept_faster`: ``auto`` leaves its first guess for the plan its live costs
  price faster when the relaunch pays for itself over the iterations left, runs it as long,
  and goes back when it measured slower.
- `replanner`: ``run.replan``'s drift watch, re-planning with the task's ranking.
- `rank`: every ranking above, its search budgeted to a share of the run's time
  (`PLANNING_SHARE`, at least `MIN_SEARCH_SECONDS`) and its progress printed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import structlog

from rlinf.sched import (
    Cluster,
    CostModel,
    DriftPolicy,
    ExecutionPlan,
    PlanningError,
    PlanProgress,
    PlanResult,
    Profile,
    ProfileCache,
    Replanner,
    format_cut,
    profile_key,
    switch_pays,
)
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow.auto import merge_run_profiles
from rlinf.workers.flow.trials import fastest, run_trials
from rlinf.workers.training.plan_history import (
    MeasuredPlan,
    calibrated,
    measured_plans,
    plan_key,
    with_measured,
)
from rlinf.workers.training.task import PlanChoice, RunSettings, TrainingTask

__all__ = ["LIVE_MIN_GAIN", "LIVE_STEPS", "PLANNING_SHARE", "PLAN_FILE", "PROFILE_FILE",
           "cache_run_profile", "choose_plan", "describe_plan", "fits", "format_plans",
           "kept_faster", "live_switch", "priced_live", "profile_cache", "rank",
           "remember_plan", "replanner", "resumed_choice", "save_choice", "tried_choice",
           "with_history"]

_log = structlog.get_logger(__name__)

PROFILE_FILE = "profile.json"
"""The measured profile the plan was priced with (reused on resume)."""
PLAN_FILE = "plan.json"
"""``auto``: the planner's ranked plans."""
LIVE_STEPS = 3
"""A plan no profile priced (`PlanChoice.live`) is priced after this many iterations of the
run (the first a warm-up), or at its last when it is shorter."""
PLANNING_SHARE = 0.05
"""The most of a run's predicted time (its iterations left, priced as its first guess)
``auto``'s search may take (`rank`), but at least `MIN_SEARCH_SECONDS`."""
MIN_SEARCH_SECONDS = 0.25
"""The least time ``auto``'s search gets, however short the run: a search cut much shorter
scores too few candidates to find the plans an unbounded one finds on a few CPU slots
(benchmarks/RESULTS.md, bench-flow)."""
LIVE_MIN_GAIN = 0.05
"""``auto`` leaves its first guess for a plan its live costs price at least this much faster
(relative), and goes back when the first guess measured that much faster."""


def profile_identity(config: Mapping[str, Any], *, distributions: Sequence[str],
                     **extra: Any) -> dict[str, Any]:
    """What a task's profile depends on besides the workflow and the cluster (its
    `TrainingTask.profile_identity`): the settings that change what a component costs
    (`config`, not the run's length or outputs, so runs that differ only there share a
    profile), the installed versions of `distributions` that run the components, the
    runtime's `PROFILE_FORMAT` and the task's `extra` (e.g. its own probes' format)."""
    from importlib import metadata

    from rlinf.workers.flow.auto import PROFILE_FORMAT

    versions = {}
    for name in distributions:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {"config": dict(config), "versions": versions, "profile_format": PROFILE_FORMAT,
            **extra}


def profile_cache(settings: RunSettings) -> ProfileCache | None:
    """The run's profile cache (None when off), its folder created or refused at once."""
    if settings.profile_cache is None:
        return None
    cache = ProfileCache(settings.profile_cache)
    try:  # refuse an unusable folder before the run, not after it
        cache.directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"run.profile_cache={settings.profile_cache!r}: cannot create that "
                          f"folder ({exc}); give a writable folder or null") from exc
    return cache


def _cache_key(task: TrainingTask[Any, Any], cluster: Cluster) -> str:
    return profile_key(workflow=task.pricing.workflow, cluster=cluster,
                       model=dict(task.profile_identity()))


def cache_run_profile(task: TrainingTask[Any, Any], cluster: Cluster,
                      measured: Profile) -> None:
    """Add what a run measured of itself to the profile cache (merged with what is there;
    a cache that cannot be written is logged and skipped: the run has what it needs). The
    plans runs measured stay: `measured` holds none (`remember_plan` adds them)."""
    _update_cache(task, cluster, lambda cached: merge_run_profiles(cached, measured))


def remember_plan(task: TrainingTask[Any, Any], cluster: Cluster, measured: MeasuredPlan) -> None:
    """Record in the profile cache what a run measured of its plan (`plan_history`), for
    ``auto``'s next ranking; nothing without a cache or a cached profile to add it to."""
    _update_cache(task, cluster,
                  lambda cached: None if cached is None else with_measured(cached, measured))


def _update_cache(task: TrainingTask[Any, Any], cluster: Cluster,
                  update: Callable[[Profile | None], Profile | None]) -> None:
    """Replace the task's cached profile by `update` of it (None: leave it); without a cache
    nothing, and a cache that cannot be read or written is logged and skipped."""
    cache = profile_cache(task.settings)
    if cache is None:
        return
    key = _cache_key(task, cluster)
    try:
        updated = update(cache.load(key))
        if updated is not None:
            cache.save(key, updated)
    except OSError as exc:
        _log.warning("profile_cache_store_failed", directory=str(cache.directory),
                     error=str(exc))


def choose_plan(task: TrainingTask[Any, Any], cluster: Cluster, *, out: TextIO,
                trials: bool = True, measure: bool = False) -> PlanChoice:
    """The plan to launch, chosen without delaying the run (module docstring); with
    `trials`, ``auto`` runs its closest-priced plans for a few steps and keeps the
    fastest as measured (`tried_choice`). `measure` (a dry run's choice, never a
    run's): ``auto`` with no cached profile runs the task's probes
    (`TrainingTask.profile`), caches what they measured and plans from it."""
    settings = task.settings
    if not settings.auto and not settings.predict:
        return PlanChoice(plan=task.fixed_plan(cluster))
    label = "auto" if settings.auto else "predict"
    cache = profile_cache(settings)
    profile = None if cache is None else cache.load(_cache_key(task, cluster))
    if (profile is None or not profile.measurements) and measure and settings.auto:
        print("auto: no profile of this workflow, model and cluster is cached: profiling "
              "(probe runs) ...", file=out, flush=True)
        started = time.perf_counter()
        profile = task.profile(cluster)
        if cache is not None:
            cache.save(_cache_key(task, cluster), profile)
        print(f"auto: profiled in {time.perf_counter() - started:.1f} s"
              + (f" ({cache.path(_cache_key(task, cluster))})" if cache is not None else ""),
              file=out, flush=True)
        return _ranked_choice(task, profile, cluster, out=out, trials=trials)
    if profile is None or not profile.measurements:
        plan = task.first_guess(cluster) if settings.auto else task.fixed_plan(cluster)
        why = ("no profile of this workflow, model and cluster is cached" if cache is not None
               else "run.profile_cache is off")
        start = "starting collocated (the first guess)" if settings.auto else "starting at once"
        print(f"{label}: {why}: {start}, priced from the run's own first steps"
              f"{' and cached for the next run' if cache is not None else ''}",
              file=out, flush=True)
        return PlanChoice(plan=plan, live=True)
    print(f"{label}: priced from the profile measured before for this workflow, model and "
          f"cluster ({cache.path(_cache_key(task, cluster)) if cache else ''})",
          file=out, flush=True)
    if not settings.auto:
        plan, simulation = task.pricing.price(task.fixed_plan(cluster), profile, cluster)
        return PlanChoice(plan=plan, profile=profile, simulation=simulation,
                          modeled=plan.predicted_time)
    return _ranked_choice(task, profile, cluster, out=out, trials=trials)


def _ranked_choice(task: TrainingTask[Any, Any], profile: Profile, cluster: Cluster, *,
                   out: TextIO, trials: bool) -> PlanChoice:
    """``auto``'s plan from a measured profile: ranked, printed, and (with `trials`) the
    fastest of the closest-priced as measured."""
    # The search can take a while on a cluster of many slots: say so before it starts.
    print(f"auto: planning on {cluster.num_devices} device(s) (the planner's search, each "
          "plan priced as the flow runs it) ...", file=out, flush=True)
    choice = with_history(task, rank(task, profile, cluster, steps=task.settings.steps,
                                     out=out), profile, cluster, out=out)
    if choice.ranked is not None:
        format_plans(choice.ranked, out)
    return tried_choice(task, choice, cluster, out=out) if trials else choice


def with_history(task: TrainingTask[Any, Any], choice: PlanChoice, profile: Profile,
                 cluster: Cluster, *, out: TextIO) -> PlanChoice:
    """`choice` (a ranking from `profile`) corrected by the plans earlier runs measured
    (`plan_history.calibrated`): the fastest by corrected price, with the raw model price
    it is judged by and, when no run measured it, the fallback the run goes back to.
    Without such runs, `choice` as the model priced it (that price kept as `modeled`)."""
    history = {key: m for key, m in measured_plans(profile).items() if fits(m.plan, cluster)}
    if choice.ranked is None or not history:
        return dataclasses.replace(choice, modeled=choice.plan.predicted_time)
    modeled = {plan_key(p): p.predicted_time for p in choice.ranked.ranked}

    def price(plan: ExecutionPlan) -> ExecutionPlan:
        try:
            return task.pricing.price(plan, profile, cluster)[0]
        except (ConfigError, KeyError, ValueError) as exc:  # a record this flow cannot run
            raise PlanningError(f"{plan.spec}: {exc}") from exc

    fixed = calibrated(choice.ranked, history, price)
    best = fixed.result.best
    unit = task.settings.unit
    fastest = min(history.values(), key=lambda m: m.seconds)
    error = (f"plans measured up to {fixed.error:.2f}x what the model priced them at before "
             "they ran, so each plan no run measured is priced that much higher"
             if fixed.error > 1 else "the model has priced no plan under what it then measured")
    print(f"auto: {len(history)} plan(s) measured by earlier runs, the fastest "
          f"{fastest.plan.spec} at {fastest.seconds:.3f} s per {unit}; {error}",
          file=out, flush=True)
    simulation = choice.simulation if plan_key(best) == plan_key(choice.plan) else \
        task.pricing.price(best, profile, cluster)[1]
    return dataclasses.replace(choice, plan=best, ranked=fixed.result, simulation=simulation,
                               modeled=modeled.get(plan_key(best))
                               if plan_key(best) not in fixed.measured else None,
                               fallback=fixed.fallback)


def rank(task: TrainingTask[Any, Any], costs: Profile | CostModel, cluster: Cluster, *,
         steps: int, out: TextIO | None) -> PlanChoice:
    """`Pricing.rank` for a run of `steps` more iterations: the planner's search, and its
    exact pass within it, may take `PLANNING_SHARE` of their time as the first guess is
    priced, the search at least `MIN_SEARCH_SECONDS` (a short run on CPU slots cannot spend
    on planning what a long one on GPUs can), and a long search prints where it stands on
    `out` every few seconds."""
    pricing = task.pricing
    try:
        guess, _ = pricing.price(task.first_guess(cluster), costs, cluster)
        budget: float | None = PLANNING_SHARE * steps * guess.predicted_time
    except PlanningError:  # the first guess does not fit: no estimate of the run
        budget = None
    unit = task.settings.unit

    def show(progress: PlanProgress) -> None:
        print(f"auto: still planning {progress.line(unit)}", file=out, flush=True)

    search = None if budget is None else max(budget, MIN_SEARCH_SECONDS)
    return pricing.rank(costs, cluster, options=pricing.planner_options(exact_seconds=budget,
                                                                        search_seconds=search),
                        progress=None if out is None else show)


def tried_choice(task: TrainingTask[Any, Any], choice: PlanChoice, cluster: Cluster, *,
                 out: TextIO) -> PlanChoice:
    """``auto``'s trials: the plans priced within ``trial_margin`` of the best each run for
    ``trial_steps`` iterations in a throw-away flow (closed before the run starts), and
    `choice` with the fastest as measured, priced by the task (unchanged, untried, when no
    other plan is priced that close: `rlinf.workers.flow.trials.run_trials`)."""
    settings = task.settings
    if choice.ranked is None or choice.profile is None or settings.trial_plans < 2:
        return choice

    def measure(plan: ExecutionPlan) -> list[float]:
        with task.launch(plan, cluster) as flow:
            return [flow.step(step).seconds for step in range(settings.trial_steps)]

    trials = run_trials(choice.ranked.ranked, measure, limit=settings.trial_plans,
                        margin=settings.trial_margin, steps=settings.trial_steps,
                        unit=f"{settings.unit}s", out=out)
    if not trials:
        return choice
    tried = fastest(trials).plan
    plan, simulation = task.pricing.price(tried, choice.profile, cluster)
    measured_before = plan_key(tried) in measured_plans(choice.profile)
    # Priced as the ranking priced it (by what a run measured of it, where one did).
    return dataclasses.replace(choice, plan=dataclasses.replace(
        plan, predicted_time=tried.predicted_time), simulation=simulation, trials=trials,
        modeled=None if measured_before else plan.predicted_time, fallback=None)


def save_choice(choice: PlanChoice, run_dir: Path) -> None:
    """Keep the profile the plan was priced with (a resume prices from it) and the ranks."""
    if choice.profile is not None:
        choice.profile.save(run_dir / PROFILE_FILE)
    if choice.ranked is not None:
        choice.ranked.save(run_dir / PLAN_FILE)


def fits(plan: ExecutionPlan, cluster: Cluster) -> bool:
    """Whether every device `plan` places a component on exists in `cluster`."""
    return all(device < cluster.num_devices for comp in plan.placement for device in comp.devices)


def resumed_choice(task: TrainingTask[Any, Any], plan: ExecutionPlan,
                   cluster: Cluster) -> PlanChoice:
    """The checkpoint's plan, priced again from the run's saved profile if it has one."""
    path = task.settings.run_dir / PROFILE_FILE
    if not (task.settings.predict and path.is_file()):
        return PlanChoice(plan=plan)
    profile = Profile.load(path)
    priced, simulation = task.pricing.price(plan, profile, cluster)
    priced = dataclasses.replace(priced, parallelism=plan.parallelism)  # the cut it resumes
    return PlanChoice(plan=priced, profile=profile, simulation=simulation)


def priced_live(task: TrainingTask[Any, Any], choice: PlanChoice, measured: Profile,
                cluster: Cluster, *, steps: int, out: TextIO, since: int = 1,
                cache: bool = True) -> PlanChoice:
    """`choice` priced from what the run measured of itself in its steps `since`..`steps`
    (1: its first `steps`): the simulated iteration of its plan, printed, kept in the run
    folder for a resume and, with `cache`, added to the profile cache."""
    plan, simulation = task.pricing.price(choice.plan, measured, cluster)
    plan = dataclasses.replace(plan, parallelism=choice.plan.parallelism)  # the cut it runs
    unit = task.settings.unit
    which = (f"in its first {steps} {unit}(s)" if since <= 1 else
             f"again in {unit}s {since}-{steps}, past its warm-up")
    print(f"predict: {plan.predicted_time:.3f} s per {unit} for {plan.spec} (priced from the "
          f"components this run measured {which})", file=out, flush=True)
    priced = dataclasses.replace(choice, plan=plan, profile=measured, simulation=simulation,
                                 live=False)
    save_choice(priced, task.settings.run_dir)
    if cache:
        cache_run_profile(task, cluster, measured)
    return priced


def live_switch(task: TrainingTask[Any, Any], choice: PlanChoice, cluster: Cluster, *,
                steps_left: int, launch_seconds: float, out: TextIO) -> ExecutionPlan | None:
    """``auto`` on its first guess, priced from its own steps: the plan those costs price
    fastest (`Pricing.rank`), when moving to it pays for a relaunch over the steps left
    (`rlinf.sched.switch_pays`); None to stay. No planning at all when even a plan of no
    cost could not save a relaunch over the steps left."""
    if not task.settings.auto or choice.profile is None:
        return None
    current = choice.plan.predicted_time
    if not switch_pays(current, current * 1e-9, steps_left=steps_left,
                       switch_s=launch_seconds, min_gain=LIVE_MIN_GAIN):
        return None  # not even a plan of no cost would pay for a relaunch: no planning
    best = rank(task, choice.profile, cluster, steps=steps_left, out=out).plan
    if (best.spec, dict(best.granularity)) == (choice.plan.spec, dict(choice.plan.granularity)):
        return None
    if not task.compatible(choice.plan, best):
        print(f"auto: {best.spec} is priced at {best.predicted_time:.3f} s per "
              f"{task.settings.unit}, but this run's checkpoint cannot move to it: staying on "
              f"{choice.plan.spec}", file=out, flush=True)
        return None
    pays = switch_pays(current, best.predicted_time, steps_left=steps_left,
                       switch_s=launch_seconds, min_gain=LIVE_MIN_GAIN)
    unit = task.settings.unit
    print(f"auto: {best.spec} is priced at {best.predicted_time:.3f} s per {unit} against "
          f"{current:.3f} for {choice.plan.spec}: "
          + (f"trying it for {LIVE_STEPS} {unit}s" if pays else
             f"not worth a relaunch ({launch_seconds:.1f} s) over the {steps_left} "
             f"{unit}s left"), file=out, flush=True)
    return best if pays else None


def kept_faster(choice: PlanChoice, tried: tuple[PlanChoice, float], *, measured: float,
                steps_left: int, launch_seconds: float, unit: str,
                out: TextIO) -> ExecutionPlan | None:
    """``auto`` tried `choice` for as many steps as the plan it left ran: that plan again
    when it measured faster (and going back pays), None to keep `choice`."""
    previous, previous_s = tried
    back = switch_pays(measured, previous_s, steps_left=steps_left, switch_s=launch_seconds,
                       min_gain=LIVE_MIN_GAIN)
    print(f"auto: {choice.plan.spec} measured {measured:.3f} s per {unit} against "
          f"{previous_s:.3f} for {previous.plan.spec}: "
          f"{'going back' if back else 'keeping it'}", file=out, flush=True)
    return previous.plan if back else None


def replanner(task: TrainingTask[Any, Any], choice: PlanChoice,
              cluster: Cluster) -> Replanner | None:
    """The run's re-planner (``run.replan``): it re-plans with `Pricing.rank` and
    prices plans with `Pricing.price`, as ``auto`` did; None when off, or when no
    measured profile priced the plan (logged)."""
    settings = task.settings
    if not settings.replan:
        return None
    if choice.profile is None:
        _log.warning("replan_disabled", reason="no measured profile to re-fit (set run.predict)")
        return None
    pricing = task.pricing
    return Replanner(
        pricing.workflow, cluster, choice.plan, pricing.cost_model(choice.profile, cluster),
        # Budgeted for the whole run: the re-planner is not told the steps left.
        planner=lambda _workflow, cost, cl: _ranked(
            rank(task, cost, cl, steps=settings.steps, out=None)),
        price=lambda plan, cost: pricing.price(plan, cost, cluster)[1],
        policy=DriftPolicy(threshold=settings.replan_threshold,
                           patience=settings.replan_patience))


def _ranked(choice: PlanChoice) -> PlanResult:
    if choice.ranked is None:  # pragma: no cover - rank always ranks
        raise ConfigError("the task's rank returned no ranked plans")
    return choice.ranked


def format_plans(result: PlanResult, out: TextIO, *, limit: int = 5) -> None:
    """Print the ranked plans and the fixed-mode baselines with predicted iteration times."""
    print("planner: ranked plans (predicted seconds per iteration)", file=out)
    for i, p in enumerate(result.ranked[:limit], start=1):
        marker = "*" if i == 1 else " "
        print(f" {marker}{i}. {p.predicted_time:8.3f} s  {p.mode.value:13s} {p.spec}  "
              f"micro-batch {dict(p.micro_batch)}", file=out)
    for name, p in sorted(result.baselines.items()):
        print(f"    best {name:13s} {p.predicted_time:8.3f} s  {p.spec}", file=out)
    print(f"    ({result.evaluated} simulations, {result.seconds:.2f} s)", file=out)


def describe_plan(p: ExecutionPlan, out: TextIO, *, predicted: bool) -> None:
    """Print a plan's mode, placement, ranks, message sizes, cuts and (if priced) predicted
    time."""
    print(f"plan: {p.mode.value} — {p.spec}", file=out)
    for comp in p.placement:
        print(f"  {comp.component:9s} devices {list(comp.devices)}  ranks {comp.num_procs}",
              file=out)
    print(f"  granularity (items per message): {dict(p.granularity)}", file=out)
    for name, cut in p.parallelism.items():
        print(f"  {name} cut: {format_cut(cut)}", file=out)
    if predicted:
        print(f"  predicted iteration time: {p.predicted_time:.3f} s "
              f"(utilisation {p.utilisation:.0%})", file=out)


def dry_run(task: TrainingTask[Any, Any], *, out: TextIO, offline: Cluster | None = None,
            measure: bool = False) -> PlanChoice:
    """Print the plan a run of `task` would launch, and train nothing. A fixed placement is
    laid out on `offline` (a cluster discovered without Ray; None: `task.cluster()`) and
    starts nothing; ``auto`` starts the backend (Ray to see a cluster) and prints the ranked plans
    when a cached profile prices them (with `measure`, from probe runs when none is
    cached), else what the run would start with."""
    if not task.settings.auto:
        choice = PlanChoice(plan=task.fixed_plan(offline or task.cluster()))
        describe_plan(choice.plan, out, predicted=False)
        print("  (predicted iteration time: priced from the run's first steps)", file=out)
        return choice
    from rlinf.workers.runtime.backend import start_runtime
    from rlinf.workers.runtime.ray_session import stop_ray

    owns_ray = start_runtime(**task.ray_options())
    try:
        choice = choose_plan(task, task.cluster(), out=out, trials=False, measure=measure)
    finally:
        if owns_ray:
            stop_ray()
    describe_plan(choice.plan, out, predicted=choice.simulation is not None)
    return choice


def collocated_devices(cluster: Cluster) -> int:
    """Devices ``auto``'s first guess collocates every component on, taking turns (no
    process start, hand-over or message a profile would have to justify): all of them;
    on CPU slots no more than the nodes have cores (more would run a process per slot on
    shared cores)."""
    cores = sum(node.cpus for node in cluster.nodes)
    if cluster.has_gpus or cores <= 0:
        return cluster.num_devices
    return max(1, min(cluster.num_devices, cores))
