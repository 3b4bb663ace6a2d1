"""Self-healing: with ``run.max_restarts=1`` a run whose env worker is SIGKILLed mid-run
restarts from its last checkpoint, exits 0, records the restart, and writes the metrics of
an uninterrupted run; with ``run.max_restarts=0`` the same kill ends the run (exit 1, the
--resume hint)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from rlinf.workers.telemetry import read_metrics

from .conftest import BASE_ENV, TINY, run_cli, summary_of
from .test_resume import _deterministic

ARGS = [*(a for a in TINY if not a.startswith(("run.iterations=", "run.checkpoint_every="))),
        "run.iterations=6", "run.checkpoint_every=2", "run.video=false"]


def _start(run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    """The CLI on one machine (its workers are its descendants)."""
    return subprocess.Popen([sys.executable, "-m", "rlinf_embodied.cli", *ARGS, *extra,
                             "--run-dir", str(run_dir)], env={**BASE_ENV, "RAY_ADDRESS": ""},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _kill_env_worker_after(proc: subprocess.Popen[str], run_dir: Path, step: int) -> None:
    """SIGKILL the run's env worker (on one device, the process it shares with the actor)
    once its metrics have reached iteration `step`."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        path = run_dir / "metrics.jsonl"
        if path.exists() and any(r.get("step", -1) >= step and "episodes" in r
                                 for r in read_metrics(path)):
            for child in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if child.name() in ("EnvRole", "SharedProcess") or " ".join(
                            child.cmdline()).startswith(("ray::EnvRole", "ray::SharedProcess")):
                        child.send_signal(signal.SIGKILL)
                        return
        time.sleep(0.05)
    raise AssertionError(f"the run never reached iteration {step} with a live env worker")


def test_a_killed_worker_restarts_from_the_checkpoint_and_changes_nothing(tmp_path, ray_address):
    whole, healed = tmp_path / "whole", tmp_path / "healed"
    proc = _start(healed, "run.max_restarts=1")
    _kill_env_worker_after(proc, healed, 3)
    reference = run_cli([*ARGS, "--run-dir", str(whole)], ray_address=ray_address)
    out, _ = proc.communicate(timeout=300)
    assert reference.returncode == 0, reference.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "restart 1 of 1 from iteration 2" in out
    # env (its policy inline) and the actor share the killed process
    assert summary_of(healed)["restarts"] == ["actor+env rank 0 died; went on from iteration 2"]
    records = read_metrics(healed / "metrics.jsonl")
    assert [r["step"] for r in records if "run/restarts" in r] == [2]
    expected = [_deterministic(r) for r in read_metrics(whole / "metrics.jsonl")]
    got = [_deterministic(r) for r in records if "run/restarts" not in r]
    assert got == expected


def test_without_restarts_a_killed_worker_ends_the_run_with_the_resume_hint(tmp_path):
    proc = _start(tmp_path / "run")
    _kill_env_worker_after(proc, tmp_path / "run", 3)  # past the checkpoint of iteration 2
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out[-4000:]
    assert "died" in out and "with --resume" in out, out[-4000:]
