"""`--dry-run`: the resolved config and the plan, nothing trained (auto: the ranked plans)."""

from __future__ import annotations

import re

import yaml
from rlinf_embodied.pricing import TIE_TOLERANCE

from .conftest import run_cli


def test_dry_run_prints_config_and_fixed_plan(tmp_path):
    proc = run_cli(["placement=hybrid", "run.iterations=7", "--dry-run", "--run-dir",
                    str(tmp_path / "run")], ray_address=None, timeout=120)
    assert proc.returncode == 0, proc.stderr
    config_text, _, plan_text = proc.stdout.partition("\nplan: ")
    config = yaml.safe_load(config_text)
    assert config["run"]["iterations"] == 7
    assert config["env"]["id"] == "gym:InvertedDoublePendulum-v5"
    assert config["placement"] == {"spec": "hybrid", "num_devices": 2}
    assert plan_text.startswith("hybrid — env: 0, rollout: 1, actor: 0-1")
    assert "{'env->rollout': 8, 'rollout->env': 8, 'env->actor': 2048}" in plan_text
    assert not (tmp_path / "run").exists()


def test_dry_run_auto_prints_the_planners_ranked_plans(auto_dry_run):
    cache, run_dir, proc = auto_dry_run
    assert proc.returncode == 0, proc.stderr
    assert "auto: profiled in" in proc.stdout
    assert "priced from the profile" not in proc.stdout  # the cache was empty: it profiled
    assert len(list(cache.glob("*.json"))) == 1  # ... and kept the profile there
    ranked = [re.match(r"^ ([ *])\d+\.\s+([\d.]+) s ", line) for line in proc.stdout.splitlines()]
    plans = [m for m in ranked if m is not None]
    assert len(plans) >= 2, proc.stdout
    assert plans[0].group(1) == "*"  # the best plan is the chosen one
    times = [float(m.group(2)) for m in plans]
    # Plans within the tie tolerance of the fastest come first, fewest device slots first
    # (so not by time among themselves); the rest follow ranked by predicted time.
    tied = [t <= min(times) * (1 + TIE_TOLERANCE) + 1e-3 for t in times]  # printed to 3 dp
    assert tied[0] and times[0] > 0
    assert tied == sorted(tied, reverse=True), times
    rest = [t for t, near in zip(times, tied, strict=True) if not near]
    assert rest == sorted(rest), times
    assert not run_dir.exists()
