"""`run.profile_cache`: which settings a cached profile is keyed by, reuse, a bad folder."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import pytest
from rlinf_embodied.cli import load_config
from rlinf_embodied.errors import AppConfigError
from rlinf_embodied.planning import cluster_for
from rlinf_embodied.profile_reuse import profile_identity, reusing, usable_cache
from rlinf_embodied.spec import build_spec
from rlinf_embodied.workflow import embodied_workflow

from rlinf.sched import Measurement, Profile

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
    return Profile(measurements=(Measurement("env", 4, 1, seconds, peak_memory_bytes=1 << 20),))


def test_a_second_run_of_the_same_config_reuses_the_profile(tmp_path: Path) -> None:
    calls: list[Sequence[int]] = []

    def measure(sizes: Sequence[int]) -> Profile:
        calls.append(tuple(sizes))
        return _profile(0.1 * len(calls))

    def planned_with(*overrides: str) -> tuple[Profile, str]:
        cfg = load_config(["placement=auto", f"run.profile_cache={tmp_path}", *overrides])
        workflow = embodied_workflow(build_spec(cfg))
        out = io.StringIO()
        cached = reusing(usable_cache(cfg), cfg, workflow, cluster_for(cfg.placement),
                         measure, out=out)
        return cached(SIZES), out.getvalue()

    first, said = planned_with()
    assert calls == [SIZES] and said == ""
    again, said = planned_with("run.iterations=5")  # only the run's length differs
    assert again == first and len(calls) == 1
    assert said.startswith("auto: reusing the profile measured for this workflow")
    other, _ = planned_with("env.num_envs=8")  # another cost: measured again
    assert len(calls) == 2 and other != first
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_without_a_cache_every_run_profiles() -> None:
    cfg = load_config(["placement=auto"])
    measure = lambda sizes: _profile(1.0)  # noqa: E731
    assert usable_cache(cfg) is None
    assert reusing(None, cfg, embodied_workflow(build_spec(cfg)), cluster_for(cfg.placement),
                   measure) is measure


def test_a_folder_that_cannot_be_made_is_refused_before_profiling(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = load_config(["placement=auto", f"run.profile_cache={blocker / 'profiles'}"])
    with pytest.raises(AppConfigError, match=r"run\.profile_cache"):
        usable_cache(cfg)
    proc = run_cli(["placement=auto", f"run.profile_cache={blocker / 'profiles'}",
                    "--dry-run"], ray_address=None, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "run.profile_cache" in proc.stderr and "Traceback" not in proc.stderr


def test_an_empty_folder_name_is_refused() -> None:
    with pytest.raises(AppConfigError, match=r"run\.profile_cache"):
        load_config(["placement=auto", "run.profile_cache="])
