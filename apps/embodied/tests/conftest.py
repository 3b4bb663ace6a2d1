"""Fixtures of the app's end-to-end tests: the real CLI in a subprocess, tiny budgets.

CLI runs start no Ray: their workers are processes of this machine. With
``RLINF_TEST_RAY=1`` they connect (``RAY_ADDRESS``) to one local Ray instance per test
session instead, owned by a helper process (closing its stdin shuts it down), so tests that
`ray.init` in-process (test_flow.py) are unaffected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from rlinf.workers.runtime.ray_session import local_ray_instance

BASE_ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
            "TOKENIZERS_PARALLELISM": "false"}

# Tiny budgets every run test shares (2 iterations of 4 envs x 16 steps, tiny MLP).
TINY = ("run.iterations=2", "run.rollout_steps=16", "env.num_envs=4", "env.pipeline_stages=2",
        "algorithm.epochs=2", "algorithm.num_minibatches=4", "policy.hidden_sizes=[16,16]",
        "run.eval_episodes=2", "env.max_episode_steps=50", "run.eval_max_steps=50",
        "run.checkpoint_every=1")


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """The Ray instance the CLI runs connect to: none (``""``), so each run's workers are
    processes of this machine, as a user's run on one machine; with ``RLINF_TEST_RAY=1``
    the GCS address of one Ray instance that lives as long as the test session."""
    if os.environ.get("RLINF_TEST_RAY") != "1":
        yield ""
        return
    with local_ray_instance(env=BASE_ENV, shutdown_timeout=60) as address:
        yield address


@pytest.fixture(scope="session")
def auto_dry_run(ray_address: str, tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """`placement=auto --dry-run` of the TINY config into an empty profile cache: (the cache
    folder, the run dir it must not create, the process). The cache then holds the TINY
    profile, so the `auto` run tests plan from it instead of profiling again."""
    root = tmp_path_factory.mktemp("auto")
    cache, run_dir = root / "profiles", root / "run"
    proc = run_cli([*TINY, "placement=auto", f"run.profile_cache={cache}", "--dry-run",
                    "--run-dir", str(run_dir)], ray_address=ray_address, timeout=240)
    return cache, run_dir, proc


def run_cli(args: Sequence[str], *, ray_address: str | None, timeout: float = 240,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m rlinf_embodied.cli *args`, connected to `ray_address` when given."""
    env = {**BASE_ENV, "RAY_ADDRESS": ray_address or "", **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "rlinf_embodied.cli", *args],
                          capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)


def summary_of(run_dir: Path) -> dict[str, object]:
    """The run's summary.json."""
    loaded: dict[str, object] = json.loads((run_dir / "summary.json").read_text())
    return loaded


def check_outputs(run_dir: Path, *, iterations: int, video: bool = True) -> list[dict[str, float]]:
    """Every output of a finished run exists and is well-formed; returns the metrics."""
    from PIL import Image

    from rlinf.workers.telemetry import read_metrics

    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [int(r["step"]) for r in records]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == iterations
    train = [r for r in records if "policy_loss" in r]
    assert [int(r["step"]) for r in train] == list(range(1, iterations + 1))
    for r in train:
        assert r["env_steps_per_s"] > 0 and r["entropy"] == r["entropy"]  # finite, not NaN
    env_steps = [r["env_steps"] for r in train]
    assert env_steps == sorted(env_steps) and env_steps[0] > 0
    evals = [r for r in records if "eval_return" in r]
    assert {int(r["step"]) for r in evals} >= {0, iterations}
    events = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert events and all(e.stat().st_size > 0 for e in events)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    assert {"policy_loss", "eval_return", "env_steps_per_s"} <= set(acc.Tags()["scalars"])
    assert len(acc.Scalars("policy_loss")) == iterations
    with Image.open(run_dir / "learning_curve.png") as png:
        assert png.format == "PNG" and min(png.size) > 100
    if video:
        with Image.open(run_dir / "eval.gif") as gif:
            assert gif.format == "GIF" and gif.n_frames >= 2
    summary = summary_of(run_dir)
    assert summary["steps"] == iterations
    assert summary["eval_return_after"] == evals[-1]["eval_return"]
    return records
