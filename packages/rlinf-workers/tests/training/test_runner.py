"""`rlinf.workers.training.train` with a toy task on a real local Ray: the metrics, the
checkpoints and the summary's outcome of a run; a resume that goes on where it stopped;
live pricing; ``auto``'s live switch held back by a checkpoint that cannot move; the plans
runs measured, which the next ``auto`` run ranks by and goes back to; the run folder's
refusals."""

from __future__ import annotations

import dataclasses
import io
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pytest

from rlinf.sched import (
    Cluster,
    CostModel,
    ExecutionPlan,
    PlannerOptions,
    PlanResult,
    Profile,
    ProgressCallback,
)
from rlinf.workers.flow import FlowRun, MacroFlow
from rlinf.workers.telemetry import Span, read_metrics
from rlinf.workers.training import (
    PlanChoice,
    Pricing,
    ResumeError,
    RunOutcome,
    RunSettings,
    train,
)
from rlinf.workers.training import planning as training_planning

from ..flow.test_run import ITEMS, declare

SCORE = "eval/score"


@dataclass(frozen=True)
class ToyStep:
    metrics: Mapping[str, float]
    seconds: float
    spans: Sequence[Span] = ()
    onloads: int = 0


class ToyFlow:
    """A launched toy flow (source → sink) whose state is the iterations it ran."""

    def __init__(self, run: FlowRun) -> None:
        self.run = run
        self.trained = 0

    def step(self, step: int, *, drain: bool = False) -> ToyStep:
        started = time.time()
        records = self.run.iteration(step, drain=drain)
        self.trained += 1
        return ToyStep({"toy/trained": float(self.trained)},
                       sum(r.seconds for r in records), onloads=self.run.onloads(since=started))

    def save(self, directory: Path) -> None:
        (directory / "toy.json").write_text(json.dumps({"trained": self.trained}))

    def load(self, directory: Path) -> None:
        self.trained = json.loads((directory / "toy.json").read_text())["trained"]

    def close(self, *, kill: bool = False) -> None:
        self.run.close(kill=kill)

    def __enter__(self) -> ToyFlow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(kill=exc[0] is not None)


class ToyPricing(Pricing):
    """The library's pricing, but ranking always chooses the disaggregated plan, priced far
    below anything measured."""

    def __init__(self, flow: MacroFlow) -> None:
        super().__init__(flow.to_sched_workflow())
        self.flow = flow

    def rank(self, costs: Profile | CostModel, cluster: Cluster, *,
             options: PlannerOptions | None = None,
             progress: ProgressCallback | None = None) -> PlanChoice:
        other = self.flow.fixed_plan("source: 0, sink: 1", num_devices=cluster.num_devices)
        best = dataclasses.replace(other, predicted_time=1e-6)
        return PlanChoice(plan=best, ranked=PlanResult((best,)),
                          profile=costs if isinstance(costs, Profile) else None)


class ToyTask:
    """`TrainingTask` of the toy flow: the evaluation scores the iterations trained."""

    resumable_keys = frozenset({"run.steps"})

    def __init__(self, run_dir: Path, *, steps: int, auto: bool = False, **settings: Any) -> None:
        self.settings = RunSettings(run_dir=run_dir, steps=steps, auto=auto, **settings)
        self.flow: MacroFlow = declare(sink_kwargs={"delay": 0.005})
        self.pricing = ToyPricing(self.flow)
        self.compatible_plans = True
        self.summaries: list[RunOutcome] = []

    def config(self) -> dict[str, Any]:
        return {"run.steps": self.settings.steps, "toy.items": ITEMS}

    def default_config(self) -> dict[str, Any]:
        return {}

    def announce(self, out: TextIO) -> None:
        print("toy: source -> sink", file=out)

    def ray_options(self) -> dict[str, Any]:
        return {}

    def cluster(self) -> Cluster:
        return Cluster.uniform(1, 2, "8GiB", "cpu")

    def profile_identity(self) -> dict[str, object]:
        return {"toy": 1}

    def fixed_plan(self, cluster: Cluster) -> ExecutionPlan:
        return self.flow.fixed_plan("source,sink: 0-1", num_devices=cluster.num_devices)

    def first_guess(self, cluster: Cluster) -> ExecutionPlan:
        return self.fixed_plan(cluster)

    def compatible(self, current: ExecutionPlan, candidate: ExecutionPlan) -> bool:
        return self.compatible_plans

    def profile(self, cluster: Cluster) -> Profile:
        raise AssertionError("a run never profiles before it starts")

    def launch(self, plan: ExecutionPlan, cluster: Cluster) -> ToyFlow:
        return ToyFlow(FlowRun.launch(self.flow, plan, cluster=cluster, timeout=120))

    def evaluate(self, flow: ToyFlow, step: int, *, final: bool) -> dict[str, float]:
        return {SCORE: float(flow.trained)}

    def record(self, result: ToyStep, *, counted: int) -> tuple[dict[str, float], int]:
        return {**result.metrics, "toy/items": float(counted + ITEMS)}, ITEMS

    def checkpointed(self, step: int, path: Path) -> None:
        pass

    def write_outputs(self, records: Sequence[Mapping[str, float]], spans: Sequence[Span],
                      last_spans: Sequence[Span], choice: PlanChoice, *, out: TextIO) -> None:
        pass

    def summarize(self, outcome: RunOutcome) -> RunOutcome:
        self.summaries.append(outcome)
        return outcome

    def print_summary(self, summary: RunOutcome, out: TextIO) -> None:
        print(f"toy: {summary.before[SCORE]} -> {summary.after[SCORE]}", file=out)


def test_a_run_evaluates_checkpoints_prices_itself_and_resumes(
        tmp_path: Path, cluster: str) -> None:
    run_dir = tmp_path / "run"
    out = io.StringIO()
    outcome = train(ToyTask(run_dir, steps=4, checkpoint_every=2), out=out)
    said = out.getvalue()
    assert "toy: source -> sink" in said and "plan: collocated" in said
    assert "predict: run.profile_cache is off: starting at once" in said
    assert "(priced from the components this run measured in its first 3 step(s))" in said
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [0, 1, 2, 3, 4]
    assert records[0][SCORE] == 0.0 and records[-1][SCORE] == 4.0
    assert [r["toy/items"] for r in records[1:]] == [8.0, 16.0, 24.0, 32.0]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == [
        "step-00000002", "step-00000004"]
    assert (outcome.before, outcome.after) == ({SCORE: 0.0}, {SCORE: 4.0})
    assert (outcome.steps, outcome.counted, outcome.counted_total) == (4, 32, 32)
    assert outcome.predicted_iteration_s is not None and outcome.predicted_iteration_s > 0
    assert outcome.measured_iteration_s is not None and len(outcome.step_seconds) == 4
    assert json.loads((run_dir / "config.json").read_text())["config"]["toy.items"] == ITEMS

    # a longer run of the same config goes on from the last checkpoint, with its plan
    out = io.StringIO()
    resumed = train(ToyTask(run_dir, steps=6, checkpoint_every=2), resume=True, out=out)
    assert "resuming from step 4" in out.getvalue()
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [0, 1, 2, 3, 4, 5, 6]
    assert resumed.before == {SCORE: 0.0} and resumed.after == {SCORE: 6.0}
    assert (resumed.counted, resumed.counted_total) == (16, 48)
    assert records[-1]["toy/items"] == 48.0

    # the folder holds a run: neither a fresh start nor a resume with nothing left
    with pytest.raises(ResumeError, match="already holds a run"):
        train(ToyTask(run_dir, steps=6), out=io.StringIO())
    with pytest.raises(ResumeError, match="nothing to do"):
        train(ToyTask(run_dir, steps=6), resume=True, out=io.StringIO())


def test_auto_stays_on_its_plan_when_its_checkpoint_cannot_move(
        tmp_path: Path, cluster: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training_planning, "switch_pays", lambda *_, **__: True)
    task = ToyTask(tmp_path / "run", steps=5, auto=True)
    task.compatible_plans = False
    out = io.StringIO()
    outcome = train(task, out=out)
    said = out.getvalue()
    assert "auto: run.profile_cache is off: starting collocated (the first guess)" in said
    assert "this run's checkpoint cannot move to it: staying on source,sink: 0-1" in said
    assert "re-plan:" not in said and outcome.choice.plan.spec == "source,sink: 0-1"
    # where it can move, the same run relaunches on the plan priced faster
    task = ToyTask(tmp_path / "moved", steps=5, auto=True)
    out = io.StringIO()
    outcome = train(task, out=out)
    assert "re-plan: source,sink: 0-1 -> source: 0, sink: 1" in out.getvalue()
    assert [int(r["step"]) for r in read_metrics(tmp_path / "moved" / "metrics.jsonl")] \
        == list(range(6))


def test_a_long_enough_run_is_priced_again_past_its_warm_up_and_caches_only_that(
        tmp_path: Path, cluster: str) -> None:
    """Priced from its first steps, again from steps 4-6 past the warm-up, and at its last
    from every step past the warm-up (a short window holds a slow spell now and then)."""
    from rlinf.workers.flow.auto import COLLOCATED_ITERATION

    cache = tmp_path / "profiles"
    task = ToyTask(tmp_path / "run", steps=8, profile_cache=str(cache))
    out = io.StringIO()
    outcome = train(task, out=out)
    said = out.getvalue()
    assert "(priced from the components this run measured in its first 3 step(s))" in said
    assert "(priced from the components this run measured again in steps 4-6, past its " \
        "warm-up)" in said
    last = "(priced from the components this run measured again in steps 4-8, past its warm-up)"
    assert last in said and said.index(last) > said.index("again in steps 4-6")
    assert outcome.predicted_iteration_s is not None and outcome.predicted_iteration_s > 0
    assert f"{outcome.predicted_iteration_s:.3f} s per step for source,sink: 0-1 {last}" in said
    # The cache holds the iterations of steps 4-8, not the warm-up's first three.
    path, = cache.glob("*.json")
    iterations = [m for m in Profile.load(path).measurements
                  if m.component == COLLOCATED_ITERATION]
    assert len(iterations) == 5


def test_auto_ranks_by_the_plans_runs_measured_and_goes_back_to_the_fastest_of_them(
        tmp_path: Path, cluster: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlinf.workers.training.plan_history import measured_plans

    monkeypatch.setattr(training_planning, "switch_pays", lambda *_, **__: True)
    cache = tmp_path / "profiles"
    # A fixed run measures the collocated plan and records it (priced from its own steps).
    train(ToyTask(tmp_path / "fixed", steps=4, profile_cache=str(cache)), out=io.StringIO())
    path, = cache.glob("*.json")
    (collocated,) = measured_plans(Profile.load(path)).values()
    assert collocated.plan.spec == "source,sink: 0-1" and len(collocated.runs) == 1
    assert collocated.modeled is None

    # auto ranks the split plan first (the model prices it at almost nothing), tries it
    # with the measured collocated plan as its fallback, and goes back to it when that pays
    # (`switch_pays` patched: it always does here).
    out = io.StringIO()
    outcome = train(ToyTask(tmp_path / "auto", steps=6, auto=True,
                            profile_cache=str(cache)), out=out)
    said = out.getvalue()
    assert "auto: 1 plan(s) measured by earlier runs, the fastest source,sink: 0-1" in said
    assert "the model has priced no plan under what it then measured" in said
    assert "plan: disaggregated — source: 0, sink: 1" in said
    assert "against " + f"{collocated.seconds:.3f} for source,sink: 0-1: going back" in said
    assert "re-plan: source: 0, sink: 1 -> source,sink: 0-1" in said
    assert outcome.choice.plan.spec == "source,sink: 0-1"
    assert outcome.predicted_iteration_s == pytest.approx(collocated.seconds)
    history = {m.plan.spec: m for m in measured_plans(Profile.load(path)).values()}
    split = history["source: 0, sink: 1"]
    assert split.modeled == 1e-6 and split.error is not None and split.error > 100
    assert len(history["source,sink: 0-1"].runs) == 2

    # The next auto run knows the model's error: it runs the fastest measured plan, untried.
    fastest = min(history.values(), key=lambda m: m.seconds).plan.spec
    out = io.StringIO()
    outcome = train(ToyTask(tmp_path / "again", steps=4, auto=True,
                            profile_cache=str(cache)), out=out)
    said = out.getvalue()
    assert "plan(s) measured by earlier runs" in said and "x what the model priced" in said
    assert f" — {fastest}\n" in said and "re-plan:" not in said
    assert outcome.choice.plan.spec == fastest
    assert outcome.choice.fallback is None and outcome.choice.modeled is None
