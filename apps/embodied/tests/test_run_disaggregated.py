"""Disaggregated placement end to end: env, rollout and actor each on their own device."""

from __future__ import annotations

from .conftest import TINY, check_outputs, run_cli, summary_of


def test_disaggregated_run(tmp_path, ray_address):
    run_dir = tmp_path / "run"
    proc = run_cli([*TINY, "placement=disaggregated", "run.video=false", "--run-dir",
                    str(run_dir)], ray_address=ray_address)
    assert proc.returncode == 0, proc.stderr
    check_outputs(run_dir, iterations=2, video=False)
    summary = summary_of(run_dir)
    assert summary["mode"] == "disaggregated"
    assert summary["placement"] == "env: 0, rollout: 1, actor: 2"
