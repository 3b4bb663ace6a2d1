"""Re-planning during a run (``run.replan``): an adopted plan is launched at a step boundary
from a checkpoint, so the run continues on the new placement with the same trajectory."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from rlinf_reasoning import cli
from rlinf_reasoning import run as run_module
from rlinf_reasoning.config import from_omegaconf
from rlinf_reasoning.pricing import ReasoningPricing
from rlinf_reasoning.workflow import fixed_plan

from rlinf.sched import Replan
from rlinf.workers.training import PlanChoice
from rlinf.workers.training import planning as training_planning
from rlinf.workers.training import runner as training_runner

pytestmark = pytest.mark.timeout(900)

TINY = (
    "run.steps=2", "data.prompts_per_step=4", "rollout.group_size=4",
    "rollout.max_new_tokens=4", "rollout.groups_per_micro_batch=2", "data.heldout_size=16",
    "algorithm.micro_batch_size=16", "run.eval_every=1", "run.checkpoint_every=0",
    "run.log_level=warning", "cluster.cpu_slots=3", "placement=hybrid", "run.predict=false",
)
"""Hybrid on 3 CPU slots, then every role on devices of its own but reward and inference:
the actor has one rank in both."""


def metrics(run_dir: Path) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def stable(record: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in record.items()
            if not k.startswith(("time", "throughput/", "replan/")) and "seconds" not in k
            and not k.endswith("_per_s")}


class SwitchOnce:
    """Stands in for `rlinf.sched.Replanner`: adopts `plan` after step 1."""

    def __init__(self, plan: Any) -> None:
        self.plan = plan
        self.observed: list[int] = []

    def observe(self, step: int, *, seconds: float, busy: dict[str, float]) -> Replan | None:
        self.observed.append(step)
        assert set(busy) <= {"rollout", "reward", "inference", "actor"} and busy
        if step != 1:
            return None
        return Replan(step, seconds, 1.0, 2.0, 1.0, True, self.plan, {"actor": 2.0})

    workflow = dataclasses.make_dataclass("W", [("names", tuple)])(
        ("rollout", "reward", "inference", "actor"))


def test_an_adopted_plan_relaunches_from_a_checkpoint_with_the_same_trajectory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = tmp_path / "reference"
    assert cli.main([*TINY, "--run-dir", str(reference)]) == 0

    fakes: list[SwitchOnce] = []

    def fake_replanner(task: Any, choice: Any, cluster: Any) -> SwitchOnce:
        fakes.append(SwitchOnce(fixed_plan(task.spec, "rollout: 0, reward,inference: 1, "
                                           "actor: 2", num_devices=3, granularity_groups=2)))
        return fakes[0]

    monkeypatch.setattr(training_runner, "replanner", fake_replanner)
    replanned = tmp_path / "replanned"
    assert cli.main([*TINY, "run.trace=true", "--run-dir", str(replanned)]) == 0
    assert fakes[0].observed == [1, 2]

    ref, new = metrics(reference), metrics(replanned)
    assert [r["step"] for r in ref] == [r["step"] for r in new] == [0, 1, 2]
    assert new[1]["replan/adopted"] == 1.0 and "replan/adopted" not in new[2]
    for a, b in zip(ref, new, strict=True):
        sa, sb = stable(a), stable(b)
        assert sa.keys() == sb.keys()
        for key in sa:
            assert math.isclose(sa[key], sb[key], rel_tol=1e-3, abs_tol=1e-3), (a["step"], key)
    # the trace shows the re-plan on the driver's track: the relaunch, with its numbers
    events = json.loads((replanned / "trace.json").read_text())["traceEvents"]
    (event,) = [e for e in events if e.get("name") == "replan"]
    assert event["args"]["step"] == 1 and event["args"]["replan/adopted"] == 1.0
    assert event["args"]["plan"] == "rollout: 0, reward,inference: 1, actor: 2"
    assert event["dur"] > 0
    summary = json.loads((replanned / "summary.json").read_text())
    assert summary["placement"] == "rollout: 0, reward,inference: 1, actor: 2"
    # the checkpoint of the switch names the new plan, so --resume relaunches it
    meta = json.loads(next((replanned / "checkpoints").glob("step-*/meta.json")).read_text())
    assert meta["plan"]["spec"] == "rollout: 0, reward,inference: 1, actor: 2"


def test_replan_needs_placement_auto() -> None:
    assert cli.main(["placement=hybrid", "run.replan=true", "--run-dir", "/nonexistent/x"]) == 2


@pytest.mark.parametrize("going_back", [True, False, None])
def test_auto_tries_the_plan_its_live_costs_price_faster_and_keeps_the_faster_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, going_back: bool | None) -> None:
    """``auto`` with nothing cached starts on its first guess, prices it from its own steps,
    moves to the plan priced fastest and, after as many steps there, keeps whichever
    measured faster. The planner is made to prefer hybrid, and the relaunch's cost is
    waived, so that a short run switches; what it keeps is decided by the measurements
    (`going_back` None), or forced each way: going back relaunches the first guess, whose
    actor has more ranks than the hybrid checkpoint it resumes from."""
    hybrid = "rollout: 0, reward,inference,actor: 1"

    def prefer_hybrid(pricing: Any, profile: Any, cluster: Any, **_: Any) -> Any:
        plan = fixed_plan(pricing.spec, hybrid, num_devices=2, granularity_groups=2)
        return PlanChoice(plan=dataclasses.replace(plan, predicted_time=1e-3))

    monkeypatch.setattr(ReasoningPricing, "rank", prefer_hybrid)
    monkeypatch.setattr(training_planning, "switch_pays",
                        lambda current, candidate, **_: candidate < current)
    if going_back is not None:
        kept_faster = training_planning.kept_faster

        def forced(*args: Any, **kwargs: Any) -> Any:
            with monkeypatch.context() as verdict:
                verdict.setattr(training_planning, "switch_pays", lambda *_, **__: going_back)
                return kept_faster(*args, **kwargs)

        monkeypatch.setattr(training_runner, "kept_faster", forced)
    run_dir = tmp_path / "run"
    args = [arg for arg in TINY if not arg.startswith(("placement=", "cluster.", "run.steps=",
                                                       "run.predict="))]
    cfg = from_omegaconf(cli.compose_config(
        [*args, "placement=auto", "cluster.cpu_slots=2", "run.steps=7",
         f"run.profile_cache={tmp_path / 'profiles'}"], run_dir=str(run_dir)))
    printed = io.StringIO()
    run_module.train(cfg, out=printed)
    out = printed.getvalue()
    first_guess = "rollout,reward,inference,actor: 0-1"
    assert f"auto: {hybrid} is priced at 0.001 s per step against" in out
    assert f"trying it for {training_planning.LIVE_STEPS} steps" in out
    assert f"re-plan: {first_guess} -> {hybrid}" in out
    (verdict,) = [line for line in out.splitlines() if " measured " in line
                  and line.startswith("auto: ")]
    tried_s, first_s = (float(word) for word in verdict.split() if word[:1].isdigit()
                        and "." in word)
    went_back = first_s < tried_s if going_back is None else going_back
    assert verdict.endswith("going back" if went_back else "keeping it")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["placement"] == (first_guess if went_back else hybrid)
    steps = [r["step"] for r in metrics(run_dir)]
    assert steps == list(range(8))  # every step once, across the relaunches


def test_auto_plans_live_only_when_a_switch_could_pay_for_its_relaunch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """3 steps left at 0.1 s each save at most 0.3 s: a 5 s relaunch never pays, so the
    planner (seconds on many slots) is not run at all."""
    planned: list[int] = []
    monkeypatch.setattr(ReasoningPricing, "rank", lambda *a, **_: planned.append(1))
    cfg = from_omegaconf(cli.compose_config(["placement=auto", "cluster.cpu_slots=2"]))
    task = run_module.ReasoningTask(cfg)
    plan = dataclasses.replace(fixed_plan(task.spec, "rollout: 0, reward,"
                                          "inference,actor: 1", num_devices=2,
                                          granularity_groups=2), predicted_time=0.1)
    choice = PlanChoice(plan=plan, profile=object())  # type: ignore[arg-type]
    assert training_planning.live_switch(task, choice, None,  # type: ignore[arg-type]
                                         steps_left=3, launch_seconds=5.0,
                                         out=io.StringIO()) is None
    assert planned == []
