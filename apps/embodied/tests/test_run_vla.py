"""The VLA path end to end: a tiny OpenVLA-style policy on rendered frames, trained with PPO
through the app (tiny budget; hybrid, so frames cross processes)."""

from __future__ import annotations

from .conftest import check_outputs, run_cli, summary_of


def test_vla_task_trains_end_to_end(tmp_path, ray_address):
    run_dir = tmp_path / "run"
    proc = run_cli(["task=vla_tiny", "placement=hybrid", "run.iterations=2",
                    "run.rollout_steps=8", "run.eval_episodes=2", "--run-dir", str(run_dir)],
                   ray_address=ray_address)
    assert proc.returncode == 0, proc.stderr
    records = check_outputs(run_dir, iterations=2)
    summary = summary_of(run_dir)
    assert summary["mode"] == "hybrid"
    assert summary["env_steps"] == 2 * 4 * 8
    train = [r for r in records if "policy_loss" in r]
    assert all(r["approx_kl"] == r["approx_kl"] for r in train)  # PPO ran on VLA log-probs
    # The evaluation video shows the 32x32 camera frames the VLA sees.
    from PIL import Image

    with Image.open(run_dir / "eval.gif") as gif:
        assert gif.size == (32, 32)
