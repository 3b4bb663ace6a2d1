"""GRPO through the app: critic-free updates over blocks of envs that start every episode
from one state (`algorithm.grpo_group_size`), each iteration from fresh seeded resets."""

from __future__ import annotations

from .conftest import TINY, check_outputs, run_cli, summary_of


def test_grpo_run(tmp_path, ray_address):
    run_dir = tmp_path / "run"
    proc = run_cli([*TINY, "algorithm.name=grpo", "algorithm.grpo_group_size=2",
                    "run.video=false", "--run-dir", str(run_dir)], ray_address=ray_address)
    assert proc.returncode == 0, proc.stderr
    records = check_outputs(run_dir, iterations=2, video=False)
    assert summary_of(run_dir)["algorithm"] == "grpo"
    train = [r for r in records if "policy_loss" in r]
    assert all("value_loss" not in r for r in train)  # no critic
