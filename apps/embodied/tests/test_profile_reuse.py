"""`run.profile_cache` for the embodied task: which settings a cached profile is keyed by,
reuse through the runner's planning, a bad folder."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import pytest
from rlinf_embodied.cli import load_config
from rlinf_embodied.errors import AppConfigError
from rlinf_embodied.profile_reuse import profile_identity
from rlinf_embodied.run import EmbodiedTask

from rlinf.sched import Measurement, Profile
from rlinf.workers.errors import ConfigError
from rlinf.workers.training import choose_plan, profile_cache

from .conftest import run_cli

SIZES = (1, 2, 4)


def _identity(*overrides: str, sizes: Sequence[int] = SIZES) -> dict[str, object]:
    return profile_identity(load_config(["placement=auto", *overrides]), sizes)


def test_the_key_ignores_the_runs_length_outputs_and_trials() -> None:
    base = _identity()
    for override in ("run.iterations=7", "run.run_dir=elsewhere", "run.eval_every=3",
                     "run.video=false", "run.trial_plans=0", "run.checkpoint_every=2",
                     "run.profile_cache=/tmp/x"):
        assert _identity(override) == base, override


def test_the_key_follows_what_a_component_costs() -> None:
    base = _identity()
    for override in ("env.num_envs=32", "run.rollout_steps=32", "run.seed=1",
                     "policy.hidden_sizes=[8,8]", "env.pipeline_stages=4",
                     "algorithm.epochs=3"):
        assert _identity(override) != base, override
    assert _identity(sizes=(1, 8)) != base
    assert {"torch", "mujoco"} <= set(base["versions"])  # type: ignore[arg-type]


def _profile(seconds: float) -> Profile:
    return Profile(measurements=tuple(Measurement(name, size, 1, seconds * size, 1 << 20)
                                      for name in ("env", "rollout", "actor")
                                      for size in (1, 2, 4)))


def test_a_dry_run_profiles_once_and_the_next_plans_from_the_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def planned_with(*overrides: str) -> str:
        cfg = load_config(["placement=auto", f"run.profile_cache={tmp_path}", *overrides])
        task = EmbodiedTask(cfg)

        def measure(cluster: object) -> Profile:
            calls.append(1)
            return _profile(0.01 * len(calls))

        monkeypatch.setattr(task, "profile", measure)
        out = io.StringIO()
        choose_plan(task, task.cluster(), out=out, trials=False, measure=True)
        return out.getvalue()

    said = planned_with()
    assert calls == [1] and "auto: profiled in" in said and "planner: ranked plans" in said
    said = planned_with("run.iterations=5")  # only the run's length differs
    assert len(calls) == 1
    assert said.startswith("auto: priced from the profile measured before for this workflow")
    planned_with("env.num_envs=8")  # another cost: measured again
    assert len(calls) == 2
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_without_a_cache_a_run_starts_on_its_first_guess() -> None:
    task = EmbodiedTask(load_config(["placement=auto"]))
    out = io.StringIO()
    choice = choose_plan(task, task.cluster(), out=out)
    # every component on both devices: one env worker each, its policy inline
    assert choice.live and choice.plan.spec == "env,rollout,actor: 0-1"
    assert "starting collocated (the first guess)" in out.getvalue()


def test_a_folder_that_cannot_be_made_is_refused_before_profiling(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = load_config(["placement=auto", f"run.profile_cache={blocker / 'profiles'}"])
    with pytest.raises(ConfigError, match=r"run\.profile_cache"):
        profile_cache(EmbodiedTask(cfg).settings)
    proc = run_cli(["placement=auto", f"run.profile_cache={blocker / 'profiles'}",
                    "--dry-run"], ray_address=None, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "run.profile_cache" in proc.stderr and "Traceback" not in proc.stderr


def test_an_empty_folder_name_is_refused() -> None:
    with pytest.raises(AppConfigError, match=r"run\.profile_cache"):
        load_config(["placement=auto", "run.profile_cache="])
