"""ManiSkill3 PickCube-v1 (state observations) through the app with a tiny budget.

Needs the `maniskill` extra and, on a CPU machine, Mesa's lavapipe Vulkan driver
(`packages/rlinf-envs/scripts/fetch-lavapipe.sh`; tox's test-embodied fetches it and sets
VK_ICD_FILENAMES/LD_LIBRARY_PATH). It is skipped only when mani_skill is not importable.
"""

from __future__ import annotations

import importlib.util

import pytest

from .conftest import check_outputs, run_cli, summary_of

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mani_skill") is None,
    reason="mani_skill is not importable: install rlinf-embodied[maniskill] (tox -e "
           "test-embodied does, with the lavapipe Vulkan driver)")


def test_pickcube_state_runs_through_the_app(tmp_path, ray_address):
    run_dir = tmp_path / "run"
    proc = run_cli(["task=pickcube", "run.iterations=2", "run.rollout_steps=10",
                    # the envs sharded over two processes, as a CPU run uses both cores
                    "env.num_envs=2", "env.processes=2", "env.pipeline_stages=1",
                    "run.eval_episodes=2",
                    "algorithm.num_minibatches=4", "policy.hidden_sizes=[32,32]",
                    "run.eval_every=0", "--run-dir", str(run_dir)],
                   ray_address=ray_address, timeout=400)
    assert proc.returncode == 0, proc.stderr
    records = check_outputs(run_dir, iterations=2)
    summary = summary_of(run_dir)
    assert summary["task"] == "maniskill:PickCube-v1"
    # PickCube defines success: both evaluations report a success rate in [0, 1].
    assert 0.0 <= summary["success_before"] <= 1.0
    assert 0.0 <= summary["success_after"] <= 1.0
    assert summary["target_success_rate"] == 0.5
    assert any("eval_success_rate" in r for r in records)
