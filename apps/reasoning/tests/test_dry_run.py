"""``--dry-run`` for fixed placements: the resolved config and plan, no training, no Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

# Counts ray.init calls: a fixed placement's dry run must start no Ray (and no worker).
PROBE = """
import sys
import ray
calls = []
_init = ray.init
ray.init = lambda *a, **k: calls.append(1) or _init(*a, **k)
from rlinf_reasoning.cli import main
rc = main(sys.argv[1:])
print("EXIT", rc, bool(calls))
"""


def dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE, "--dry-run", *args],
                          capture_output=True, text=True, timeout=180, check=False)


def test_dry_run_prints_config_and_plan_without_starting_anything(tmp_path: Path) -> None:
    proc = dry_run("run.steps=7", "algorithm=ppo", "cluster.cpu_slots=4",
                   "placement=disaggregated", "--run-dir", str(tmp_path / "run"))
    assert "EXIT 0 False" in proc.stdout, proc.stdout + proc.stderr
    out = proc.stdout
    config = yaml.safe_load(out.partition("\nplan: ")[0])
    assert config["run"]["steps"] == 7 and config["algorithm"]["name"] == "ppo"
    assert config["run"]["run_dir"] == str(tmp_path / "run")
    assert "plan: disaggregated" in out
    for role in ("rollout", "reward", "inference", "actor"):
        assert f"  {role}" in out
    assert not (tmp_path / "run").exists()  # nothing written


def test_dry_run_hybrid_spec_lists_devices() -> None:
    proc = dry_run("placement='rollout: 0, actor,reward,inference: 1'")
    assert "EXIT 0 False" in proc.stdout, proc.stdout + proc.stderr
    assert "plan: hybrid" in proc.stdout
    assert "  rollout   devices [0]  ranks 1" in proc.stdout
    assert "  actor     devices [1]  ranks 1" in proc.stdout


def test_dry_run_rejects_a_bad_placement_with_status_2() -> None:
    proc = dry_run("placement='rollout: 0, actor: 1'")
    assert "EXIT 2 False" in proc.stdout
    assert "missing from placement" in proc.stderr
