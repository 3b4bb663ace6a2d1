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


def test_a_policy_lag_run_trains_each_rollout_beside_the_next(tmp_path, ray_address):
    """algorithm.policy_lag=1 with the actor on its own device: iteration k trains on
    iteration k-1's rollout, and the last iteration also trains its own before the final
    checkpoint (none in between: checkpoint_every=0)."""
    from rlinf.workers.telemetry import read_metrics

    run_dir = tmp_path / "run"
    proc = run_cli([*TINY, "run.iterations=3", "run.checkpoint_every=0", "run.video=false",
                    "algorithm.policy_lag=1", "placement.spec='env,rollout: 0, actor: 1'",
                    "placement.num_devices=2", "--run-dir", str(run_dir)],
                   ray_address=ray_address)
    assert proc.returncode == 0, proc.stderr
    records = read_metrics(run_dir / "metrics.jsonl")
    trained = {int(r["step"]): r for r in records if "policy_loss" in r}
    assert sorted(trained) == [2, 3]  # nothing to train at 1; 3 trains rollouts 2 and 3
    assert all("importance_weight" in r and r["behaviour_kl"] == r["behaviour_kl"]
               for r in trained.values())
    summary = summary_of(run_dir)
    assert summary["policy_lag"] == 1 and summary["steps"] == 3
    assert summary["placement"] == "env,rollout: 0, actor: 1"
    assert "policy_lag=1" in proc.stdout
    assert (run_dir / "checkpoints").is_dir()
