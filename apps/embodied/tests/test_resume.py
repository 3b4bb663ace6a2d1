"""Resume after SIGKILL: a run killed right after a checkpoint and resumed with --resume
writes the same metrics, step by step, and ends with the same weights as an uninterrupted
run; a checkpoint of a different config (other than the run length) is refused before any
worker starts."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from rlinf_embodied.cli import load_config
from rlinf_embodied.errors import CheckpointMismatchError
from rlinf_embodied.run import RESUMABLE_KEYS

from rlinf.workers.schema import flat_dict
from rlinf.workers.telemetry import CheckpointStore, read_metrics
from rlinf.workers.training.folder import config_differences

from .conftest import BASE_ENV, TINY, run_cli

ARGS = [*TINY, "run.iterations=4", "run.eval_every=2", "run.video=false"]
KILL_AFTER = "step-00000002"
# Wall-clock figures differ between runs; everything else must match.
TIMING = ("seconds", "_per_s")


def _deterministic(record: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in record.items()
            if k != "time" and not any(t in k for t in TIMING)}


def _start(run_dir: Path, ray_address: str) -> subprocess.Popen[str]:
    env = {**BASE_ENV, "RAY_ADDRESS": ray_address}
    return subprocess.Popen([sys.executable, "-m", "rlinf_embodied.cli", *ARGS, "--run-dir",
                             str(run_dir)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _kill_after_checkpoint(proc: subprocess.Popen[str], run_dir: Path) -> None:
    latest = run_dir / "checkpoints" / "LATEST"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if latest.exists() and latest.read_text().strip() == KILL_AFTER:
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.02)
        else:
            _, err = proc.communicate(timeout=10)
            raise AssertionError(f"no checkpoint {KILL_AFTER} before the run ended: {err}")
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    state = torch.load(run_dir / "checkpoints" / "step-00000004" / "actor.pt",
                       weights_only=False)
    return state["actor"]["model"]


def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path, ray_address):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    # The uninterrupted reference runs beside the run that is killed (saves a minute).
    ref = _start(whole, ray_address)
    _kill_after_checkpoint(_start(killed, ray_address), killed)
    _, err = ref.communicate(timeout=240)
    assert ref.returncode == 0, err
    resumed = run_cli([*ARGS, "--run-dir", str(killed), "--resume"], ray_address=ray_address)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from iteration 2 ({killed / 'checkpoints' / KILL_AFTER})" \
        in resumed.stdout

    expected = [_deterministic(r) for r in read_metrics(whole / "metrics.jsonl")]
    got = [_deterministic(r) for r in read_metrics(killed / "metrics.jsonl")]
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    for want, have in zip(expected, got, strict=True):
        assert want.keys() == have.keys(), (want, have)
        for key, value in want.items():
            assert math.isclose(have[key], value, rel_tol=1e-6, abs_tol=1e-9), (key, want, have)
    final_a, final_b = _weights(whole), _weights(killed)
    assert final_a.keys() == final_b.keys()
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)


def _fake_checkpoint(run_dir: Path, overrides: list[str]) -> None:
    """A checkpoint whose meta holds the config of `overrides` (the payload is not read:
    the config check comes first)."""
    store = CheckpointStore(run_dir / "checkpoints")
    cfg = load_config([*TINY, *overrides])
    store.save(1, lambda d: (d / "actor.pt").write_bytes(b""), meta={"config": flat_dict(cfg)})


def test_resume_refuses_a_checkpoint_of_another_config(tmp_path):
    run_dir = tmp_path / "run"
    _fake_checkpoint(run_dir, ["run.iterations=1"])
    proc = run_cli([*TINY, "run.iterations=2", "algorithm.lr=0.001", "--run-dir", str(run_dir),
                    "--resume"], ray_address=None, timeout=120)
    assert proc.returncode == 2
    assert "was written with a different config (algorithm.lr: 0.0003 -> 0.001)" in proc.stderr
    assert "resumes only with the same config except " in proc.stderr
    assert "run.iterations" in proc.stderr


def test_only_the_run_length_may_change_on_resume(tmp_path):
    saved = flat_dict(load_config([*TINY, "run.iterations=1"]))

    def differences(*overrides: str) -> tuple[str, ...]:
        return config_differences(saved, flat_dict(load_config([*TINY, *overrides])),
                                  defaults={}, may_change=RESUMABLE_KEYS)

    assert differences("run.iterations=9") == differences("run.iterations=1") == ()
    assert differences("env.num_envs=8") == ("env.num_envs: 4 -> 8",)
    assert differences("placement=hybrid") == ("placement.num_devices: 1 -> 2",
                                               "placement.spec: 'collocated' -> 'hybrid'")
    assert issubclass(CheckpointMismatchError, ValueError)
