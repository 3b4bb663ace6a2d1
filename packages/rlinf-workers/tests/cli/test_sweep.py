"""Sweep expansion (`rlinf.workers.cli.sweep`): every combination, numbered folders, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlinf.workers.cli import expand_sweep, sweep_jobs
from rlinf.workers.errors import ConfigError


def test_a_sweep_expands_to_every_combination_last_key_fastest() -> None:
    jobs = expand_sweep(["run.seed=0,1", "run.steps=3", "algorithm=grpo,ppo"])
    assert [swept for _, swept in jobs] == [
        ("run.seed=0", "algorithm=grpo"), ("run.seed=0", "algorithm=ppo"),
        ("run.seed=1", "algorithm=grpo"), ("run.seed=1", "algorithm=ppo")]
    assert jobs[1][0] == ("run.seed=0", "run.steps=3", "algorithm=ppo")
    assert [s for _, s in expand_sweep(["run.seed=range(0,3)"])] == [
        ("run.seed=0",), ("run.seed=1",), ("run.seed=2",)]
    # a list value is one value, not a sweep
    assert expand_sweep(["run.profile_batches=[2,4]"]) == [(("run.profile_batches=[2,4]",), ())]


def test_sweep_jobs_get_numbered_folders_and_need_a_swept_key(tmp_path: Path) -> None:
    jobs = sweep_jobs(["algorithm.lr=1e-4,3e-4"])
    assert [(j.index, j.run_dir(tmp_path)) for j in jobs] == [(0, tmp_path / "0"),
                                                              (1, tmp_path / "1")]
    with pytest.raises(ConfigError, match="at least one swept key"):
        sweep_jobs(["run.steps=3"])
    with pytest.raises(ConfigError, match=r"cannot parse the override 'run.steps=\[1'"):
        expand_sweep(["run.steps=[1"])
