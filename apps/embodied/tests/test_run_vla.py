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


def test_a_pretrained_hugging_face_vla_from_a_local_folder_trains(tmp_path, ray_address):
    """`policy.vla.pretrained`: a LLaVA checkpoint saved to a folder (`save_tiny_vlm`) loads
    in the env and actor processes, acts on the frames and trains with PPO."""
    from rlinf.workers.models.tiny_vlm import save_tiny_vlm

    folder = save_tiny_vlm(tmp_path / "vlm", image_size=16)
    run_dir = tmp_path / "run"
    proc = run_cli(["task=vla_tiny", "placement=collocated", "run.iterations=2",
                    "run.rollout_steps=8", "run.eval_episodes=1", f"policy.vla.pretrained={folder}",
                    "run.checkpoint_every=1", "--run-dir", str(run_dir)],
                   ray_address=ray_address)
    assert proc.returncode == 0, proc.stderr
    records = check_outputs(run_dir, iterations=2)
    train = [r for r in records if "policy_loss" in r]
    assert len(train) == 2 and all(r["approx_kl"] == r["approx_kl"] for r in train)
    assert summary_of(run_dir)["env_steps"] == 2 * 4 * 8
    assert list(run_dir.glob("checkpoints/*"))
