"""`train`: one training run of any app, top to bottom.

    run folder (start, or the checkpoint to resume) → config.json → backend (Ray or local
    processes) → the cluster
    → plan (`rlinf.workers.training.planning.choose_plan`, or the checkpoint's) → launch
    → evaluation of the starting policy → for each iteration: flow.step → metrics
    (JSONL + loggers) → progress → evaluation every ``eval_every`` → checkpoint every
    ``checkpoint_every`` → live pricing and re-planning at iteration boundaries
    → plots, trace, summary

Resuming reloads the latest checkpoint of the run folder after checking that it was
written with the same config (except the keys a resumed run may change), keeps its plan,
drops the metric records of iterations about to be redone and continues from the next one.

Self-healing (``max_restarts``): when a worker dies, the flow has already torn down what
was left; `train` records the restart and resumes itself as above (from the start when no
checkpoint was taken yet). Restarts are written to the metrics (``run/restarts`` and
``run/devices`` at the iteration the run went on from) and to the summary. Each session
discovers the cluster afresh: when a node was lost and the checkpoint's plan names devices
the cluster no longer has, the run is planned again for the devices that remain.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import structlog

from rlinf.sched import Cluster, ExecutionPlan, Replan, Replanner
from rlinf.workers.flow.auto import run_profile
from rlinf.workers.flow.restarts import with_restarts
from rlinf.workers.runtime.backend import start_runtime
from rlinf.workers.runtime.ray_session import stop_ray
from rlinf.workers.telemetry import (
    CheckpointStore,
    ProgressDisplay,
    Span,
    metrics_writer,
    read_metrics,
    write_run_config,
)
from rlinf.workers.training.folder import (
    CHECKPOINT_DIR,
    METRICS_FILE,
    ResumePoint,
    check_run_folder,
    checkpoint_meta,
)
from rlinf.workers.training.plan_history import MeasuredPlan
from rlinf.workers.training.planning import (
    LIVE_STEPS,
    cache_run_profile,
    choose_plan,
    describe_plan,
    fits,
    kept_faster,
    live_switch,
    priced_live,
    remember_plan,
    replanner,
    resumed_choice,
    save_choice,
)
from rlinf.workers.training.task import (
    FlowT,
    PlanChoice,
    RunOutcome,
    SummaryT,
    TrainingTask,
    steady_median,
)

__all__ = ["train"]

_log = structlog.get_logger(__name__)


def train(task: TrainingTask[FlowT, SummaryT], *, resume: bool = False,
          overrides: Sequence[str] = (), out: TextIO = sys.stdout,
          ray_started: bool = False) -> SummaryT:
    """Run (or resume) `task`'s training; prints and returns its summary. A worker that
    dies restarts the run from its last checkpoint up to ``max_restarts`` times (module
    docstring); after that its `WorkerDiedError` propagates. `ray_started`: the caller
    started the Ray this process is connected to for this run, which the first session then
    owns (stops at its end, before the summary), as one it started itself."""
    settings = task.settings
    owned = [ray_started]

    def session(again: bool, restarts: tuple[str, ...]) -> SummaryT:
        owns, owned[0] = owned[0], False
        return _Session.run(task, resume=again, overrides=tuple(overrides), out=out,
                            restarts=restarts, owns_ray=owns)

    return with_restarts(
        session, resume=resume, max_restarts=settings.max_restarts, out=out,
        unit=settings.unit,
        checkpoints=CheckpointStore(settings.run_dir / CHECKPOINT_DIR,
                                    keep=settings.keep_checkpoints))


@dataclass
class _Session:
    """One session of `train`: launch, loop until a worker dies or the run is done."""

    task: TrainingTask[Any, Any]
    cluster: Cluster
    store: CheckpointStore
    point: ResumePoint | None
    overrides: tuple[str, ...]
    started: float
    out: TextIO
    restarts: tuple[str, ...]
    launch_seconds: float = 0.0
    """How long this session's launch took: what a relaunch on another plan costs."""

    @classmethod
    def run(cls, task: TrainingTask[Any, SummaryT], *, resume: bool,
            overrides: tuple[str, ...], out: TextIO, restarts: tuple[str, ...],
            owns_ray: bool) -> SummaryT:
        """A session from its start to the printed summary. `owns_ray`: this session stops
        the Ray its caller started for it, whatever happens."""
        started = time.perf_counter()
        settings = task.settings
        try:
            settings.run_dir.mkdir(parents=True, exist_ok=True)
            store = CheckpointStore(settings.run_dir / CHECKPOINT_DIR,
                                    keep=settings.keep_checkpoints)
            config = task.config()
            point = check_run_folder(settings.run_dir, store, config=config,
                                     defaults=task.default_config(),
                                     may_change=task.resumable_keys, steps=settings.steps,
                                     resume=resume, restarting=bool(restarts),
                                     unit=settings.unit)
            write_run_config(settings.run_dir, config, overrides)
            if not restarts:  # a restart loads the same things again
                task.announce(out)
            owns_ray = start_runtime(**task.ray_options()) or owns_ray
            session = cls(task=task, cluster=task.cluster(), store=store, point=point,
                          overrides=overrides, started=started, out=out, restarts=restarts)
            choice = session._choose()
            summary = session._launched(choice)
        finally:
            if owns_ray:
                stop_ray()
        # Printed once the workers and Ray are gone: the process exits right after it.
        task.print_summary(summary, out)
        return summary

    def _choose(self) -> PlanChoice:
        """The checkpoint's plan (planned again when its devices are gone), or a new one."""
        task, out, point = self.task, self.out, self.point
        if point is None:
            choice = choose_plan(task, self.cluster, out=out)
            save_choice(choice, task.settings.run_dir)
        elif fits(point.plan, self.cluster):
            choice = resumed_choice(task, point.plan, self.cluster)
        else:
            choice = self._replanned_for_lost_devices(point.plan)
        if point is not None:
            print(f"resuming from {task.settings.unit} {point.step} ({point.path})", file=out)
        describe_plan(choice.plan, out, predicted=choice.simulation is not None)
        return choice

    def _replanned_for_lost_devices(self, plan: ExecutionPlan) -> PlanChoice:
        """A plan for the devices that remain (a node was lost since `plan` was chosen); the
        last restart line says so."""
        cluster, out = self.cluster, self.out
        used = 1 + max(d for comp in plan.placement for d in comp.devices)
        print(f"the checkpoint's plan ({plan.spec}) uses {used} device(s) and the cluster has "
              f"{cluster.num_devices} left: planning again", file=out, flush=True)
        choice = choose_plan(self.task, cluster, out=out)
        save_choice(choice, self.task.settings.run_dir)
        note = f"re-planned for the {cluster.num_devices} device(s) left: {choice.plan.spec}"
        _log.warning("replanned_for_lost_devices", before=plan.spec, after=choice.plan.spec,
                     devices=cluster.num_devices)
        if self.restarts:
            self.restarts = (*self.restarts[:-1], f"{self.restarts[-1]}; {note}")
        return choice

    def _launch(self, plan: ExecutionPlan) -> Any:
        """The flow of `plan`, with a line on its processes and how long they took."""
        print("launch: starting the worker processes ...", file=self.out, flush=True)
        launching = time.perf_counter()
        flow = self.task.launch(plan, self.cluster)
        sets = flow.run.flow.process_sets(plan.placement)
        self.launch_seconds = time.perf_counter() - launching
        processes = sum(plan.placement.components[s[0]].num_procs for s in sets)
        print(f"launch: {processes} worker process(es) "
              f"({'; '.join('+'.join(s) for s in sets)}) ready in "
              f"{self.launch_seconds:.1f} s", file=self.out, flush=True)
        return flow

    def _launched(self, choice: PlanChoice) -> Any:
        with self._launch(choice.plan) as flow:
            return _Loop(self, flow, choice).run()

    def _relaunch(self, flow: Any, choice: PlanChoice, plan: ExecutionPlan,
                  checkpoint: Path) -> tuple[Any, PlanChoice]:
        """Close `flow`, launch `plan` and load the checkpoint just taken (an iteration
        boundary)."""
        unit = self.task.settings.unit
        print(f"re-plan: {choice.plan.spec} -> {plan.spec} (predicted "
              f"{plan.predicted_time:.3f} s per {unit} on the live costs); relaunching from "
              "the checkpoint", file=self.out, flush=True)
        flow.close()
        launched = self.task.launch(plan, self.cluster)
        try:
            launched.load(checkpoint)
        except BaseException:
            launched.close(kill=True)
            raise
        simulation = None
        if choice.profile is not None:
            plan, simulation = self.task.pricing.price(plan, choice.profile, self.cluster)
        return launched, dataclasses.replace(choice, plan=plan, simulation=simulation)


class _Loop:
    """The iterations of one session, with what they decide at each boundary."""

    def __init__(self, session: _Session, flow: Any, choice: PlanChoice) -> None:
        self.session = session
        self.task = session.task
        self.settings = session.task.settings
        self.flow = flow
        self.choice = choice
        self.step_seconds: list[float] = []
        self.onloads: list[int] = []
        self.counted = 0
        self.spans: list[Span] = []
        self.last_spans: list[Span] = []
        self.plan_from = 0
        """The iteration after which the current plan started (a relaunch moves it)."""
        self.tried: tuple[PlanChoice, float] | None = None
        """``auto``: the plan it left for the one its live costs priced faster, and that
        plan's measured seconds per iteration, until the new one has run as long."""
        self.modeled = None if choice.live else choice.modeled
        """The model's price of the current plan before it ran (`PlanChoice.modeled`), which
        its measurement judges the model by; None when nothing but measurements priced it."""
        self.back_seconds: float | None = None
        """The relaunch at hand returns to a plan measured before (`kept_faster`) at these
        seconds per iteration."""
        self.cached = 1
        """The flow's records the profile cache has (its first, a warm-up, never)."""
        self.reprice_at: int | None = None
        """The iteration after which a plan priced from its first iterations is priced again
        from the ones after them (the first few still warm up: allocator, caches, and run
        slower than the steady state, which the prediction is for), then again after twice
        as many and at the last (`_next_reprice`)."""

    def run(self) -> Any:
        session, task, settings = self.session, self.task, self.settings
        point = session.point
        if point is not None:
            self.flow.load(point.path)
            before, start, prior_seconds = dict(point.before), point.step, point.seconds
            prior_counted = point.counted
        else:
            before, start, prior_seconds, prior_counted = \
                dict(task.evaluate(self.flow, 0, final=False)), 0, 0.0, 0
        after = before
        self.plan_from = start
        fallback = self.choice.fallback
        if fallback is not None:  # a plan no run measured: back to the best that ran if slower
            self.tried = (PlanChoice(plan=fallback.plan, profile=self.choice.profile),
                          fallback.seconds)
        replan = replanner(task, self.choice, session.cluster)
        relaunched: list[Any] = []
        loop_start = time.perf_counter()
        redo_from = start + 1 if point is not None else (0 if session.restarts else None)
        with metrics_writer(settings.run_dir, settings.loggers, resume_step=redo_from,
                            config=task.config()) as writer, \
                ProgressDisplay(settings.steps, desc=settings.progress_desc, start=start,
                                keys=settings.progress_keys) as progress, \
                contextlib.ExitStack() as flows:
            flows.callback(_close_all, relaunched)
            if point is None:
                writer.write(0, before)
            if session.restarts:
                writer.write(start, {"run/restarts": float(len(session.restarts)),
                                     "run/devices": float(session.cluster.num_devices)})
            for step in range(start + 1, settings.steps + 1):
                last = step == settings.steps
                # With a policy lag (never with replan) a checkpoint iteration, and the last,
                # trains its own data too: nothing is in flight when the state is saved.
                due = last or bool(settings.checkpoint_every
                                   and step % settings.checkpoint_every == 0)
                result = self.flow.step(step, drain=due)
                record, counted = task.record(result, counted=prior_counted + self.counted)
                self.step_seconds.append(result.seconds)
                self.onloads.append(result.onloads)
                self.counted += counted
                if result.spans:
                    self.last_spans = list(result.spans)
                    self.spans.extend(result.spans)
                if last or (settings.eval_every and step % settings.eval_every == 0):
                    after = dict(task.evaluate(self.flow, step, final=last))
                    record.update(after)
                decision = None if replan is None else replan.observe(
                    step, seconds=result.seconds, busy=_busy(result.metrics, replan))
                if decision is not None:
                    record.update(_replan_record(decision))
                writer.write(step, record)
                progress.update(step, record)
                target = self._target(step, start, decision, result.seconds)
                switch = target is not None and not last
                path = None
                if switch or due:
                    seconds = prior_seconds + time.perf_counter() - loop_start
                    plan = target if target is not None and switch else self.choice.plan
                    path = session.store.save(step, self.flow.save, meta=checkpoint_meta(
                        task.config(), step=step, before=before, plan=plan, seconds=seconds,
                        counted=prior_counted + self.counted, overrides=session.overrides))
                    task.checkpointed(step, path)
                decided = time.time()
                if target is not None and switch and path is not None:
                    self._remember(start)
                    back, tried_seconds = self.back_seconds is not None, self.back_seconds
                    self.flow, self.choice = session._relaunch(self.flow, self.choice, target,
                                                               path)
                    self.modeled = None if back else self.choice.plan.predicted_time
                    if back and tried_seconds is not None:  # priced by what it measured
                        self.choice = dataclasses.replace(self.choice, plan=dataclasses.replace(
                            self.choice.plan, predicted_time=tried_seconds))
                    relaunched.append(self.flow)
                    self.plan_from, self.cached, self.reprice_at = step, 1, None
                if decision is not None and settings.trace:
                    self.spans.append(_replan_span(decision, decided,
                                                   time.time() if switch else decided))
        wall = prior_seconds + time.perf_counter() - loop_start
        if len(self.flow.run.records) > self.cached:  # the next run is priced before it starts
            cache_run_profile(task, session.cluster, run_profile(self.flow.run, skip=self.cached))
        self._remember(start)
        records = read_metrics(settings.run_dir / METRICS_FILE)
        task.write_outputs(records, self.spans, self.last_spans, self.choice, out=session.out)
        return task.summarize(RunOutcome(
            before=before, after=after, steps=settings.steps, wall_seconds=wall,
            total_seconds=time.perf_counter() - session.started, counted=self.counted,
            counted_total=prior_counted + self.counted, step_seconds=tuple(self.step_seconds),
            plan_seconds=tuple(self.step_seconds[self.plan_from - start:]),
            onloads=tuple(self.onloads), choice=self.choice, restarts=session.restarts))

    def _target(self, step: int, start: int, decision: Replan | None,
                seconds: float) -> ExecutionPlan | None:
        """The plan to relaunch on after `step`: the re-planner's, or ``auto``'s live
        choice (module docstring of `rlinf.workers.training.planning`); None to stay."""
        session, settings = self.session, self.settings
        self.back_seconds = None
        target = decision.plan if decision is not None and decision.adopted else None
        if target is not None and not self.task.compatible(self.choice.plan, target):
            _log.info("replan_incompatible", current=self.choice.plan.spec, plan=target.spec)
            target = None
        on_plan = self.step_seconds[self.plan_from - start:]  # its first a warm-up
        steps_left = settings.steps - step
        if self.choice.live and (step - self.plan_from == LIVE_STEPS or step == settings.steps):
            records = self.flow.run.records
            measured = run_profile(self.flow.run, skip=1 if len(records) > 1 else 0)
            # Priced again past the warm-up where the run is long enough: the profile cache
            # then keeps the later iterations only.
            again = step - self.plan_from == LIVE_STEPS and \
                self.plan_from + 2 * LIVE_STEPS < settings.steps
            self.choice = priced_live(self.task, self.choice, measured, session.cluster,
                                      steps=len(records), out=session.out, cache=False)
            live = None if target is not None else live_switch(
                self.task, self.choice, session.cluster, steps_left=steps_left,
                launch_seconds=session.launch_seconds, out=session.out)
            if live is not None:
                target, self.tried = live, (self.choice, steady_median(on_plan) or seconds)
            if again and target is None:
                self.reprice_at, self.cached = self.plan_from + 2 * LIVE_STEPS, LIVE_STEPS
            else:
                cache_run_profile(self.task, session.cluster, measured)
                self.cached = max(self.cached, len(records))
        elif self.reprice_at is not None and step == self.reprice_at:
            records = self.flow.run.records
            # Every iteration past the warm-up so far (the cache gets them at the end): a
            # window of three held a slow spell now and then, and priced the run by it.
            self.choice = priced_live(self.task, self.choice,
                                      run_profile(self.flow.run, skip=LIVE_STEPS),
                                      session.cluster, steps=len(records), since=LIVE_STEPS + 1,
                                      out=session.out, cache=False)
            self.reprice_at = _next_reprice(step, self.plan_from, settings.steps)
        elif self.tried is not None and step - self.plan_from == LIVE_STEPS:
            target = kept_faster(self.choice, self.tried,
                                 measured=steady_median(on_plan) or seconds,
                                 steps_left=steps_left, launch_seconds=session.launch_seconds,
                                 unit=settings.unit, out=session.out)
            self.back_seconds = None if target is None else self.tried[1]
            self.tried = None
        return target

    def _remember(self, start: int) -> None:
        """Record what the current plan measured per iteration past its first (warm-up) in
        the profile cache (`plan_history`); nothing for a plan that ran fewer than two."""
        on_plan = self.step_seconds[self.plan_from - start:]
        seconds = steady_median(on_plan)
        if len(on_plan) < 2 or seconds is None or seconds <= 0:
            return
        remember_plan(self.task, self.session.cluster,
                      MeasuredPlan(self.choice.plan, (seconds,), self.modeled))


def _next_reprice(step: int, plan_from: int, steps: int) -> int | None:
    """When a plan priced again at `step` is priced once more: after twice as many
    iterations of it, or at the run's last; None once that was the last."""
    if step >= steps:
        return None
    return min(plan_from + 2 * (step - plan_from), steps)


def _close_all(flows: Sequence[Any]) -> None:
    for flow in flows:
        flow.close()


def _busy(metrics: Mapping[str, float], replan: Replanner) -> dict[str, float]:
    """Each component's busy seconds in the iteration (the slowest rank's, ``time/<name>``)."""
    return {name: metrics[f"time/{name}"] for name in replan.workflow.names
            if f"time/{name}" in metrics}


def _replan_record(decision: Replan) -> dict[str, float]:
    """The metrics a re-plan adds to its iteration's record."""
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
