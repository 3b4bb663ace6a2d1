"""Collocated placement end to end through the CLI (tiny budget); every output well-formed."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from rlinf_embodied.export import load_policy

from .conftest import TINY, check_outputs, run_cli, summary_of


def test_collocated_run_writes_every_output(tmp_path, ray_address):
    run_dir = tmp_path / "run"
    proc = run_cli([*TINY, "placement=collocated", "--run-dir", str(run_dir)],
                   ray_address=ray_address)
    assert proc.returncode == 0, proc.stderr
    records = check_outputs(run_dir, iterations=2)
    summary = summary_of(run_dir)
    assert summary["mode"] == "collocated"
    assert summary["placement"] == "env,rollout,actor: 0"
    assert summary["env_steps"] == 2 * 4 * 16
    assert summary["target_return"] == 5000.0 and summary["target_reached"] is False
    before = next(r for r in records if r["step"] == 0)
    assert summary["eval_return_before"] == before["eval_return"]
    # The printed summary says before -> after, the threshold and the mode.
    out = proc.stdout
    assert "evaluation return" in out and "->" in out
    assert "return >= 5000: NOT reached" in out
    assert "mode                collocated: env,rollout,actor: 0" in out
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == [
        "step-00000001", "step-00000002"]
    config = json.loads((run_dir / "config.json").read_text())  # what the run ran with
    assert config["overrides"] == [*TINY, "placement=collocated"]
    assert config["config"]["placement.spec"] == "collocated"
    assert config["config"]["run.loggers"] == ["jsonl", "tensorboard"]

    # export: the trained policy as a file that loads without the run
    out = tmp_path / "policy"
    exported = subprocess.run([sys.executable, "-m", "rlinf_embodied.cli", "export",
                               str(run_dir), "--out", str(out)], capture_output=True,
                              text=True, timeout=300, check=False)
    assert exported.returncode == 0, exported.stderr
    policy = load_policy(out)
    latest = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    trained = torch.load(latest / "actor.pt", weights_only=False)["actor"]["model"]
    for name, tensor in policy.state_dict().items():
        assert torch.equal(tensor, trained[name]), name
    obs = torch.zeros(3, *policy.config.obs_shape)
    assert policy.act(obs, deterministic=True).action.shape == (3, policy.config.action_dim)
    assert json.loads((out / "rlinf_export.json").read_text())["step"] == 2


def test_a_second_run_into_the_same_directory_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir).mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 0, "time": 0, "eval_return": 1.0}\n')
    proc = run_cli([*TINY, "--run-dir", str(run_dir)], ray_address=None, timeout=120)
    assert proc.returncode == 2
    assert "already holds a run: pass --resume" in proc.stderr
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == 1  # nothing overwritten
