"""Your own config file (``--config-dir``/``--config-name``) and multirun sweeps (``-m``):
composition, expansion, and every job's config checked before any job runs (no training)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlinf_reasoning.cli import compose_config, main
from rlinf_reasoning.config import from_omegaconf

FIXED = ("placement=collocated", "cluster.cpu_slots=1")
"""A fixed placement: a dry run prints its plan and starts nothing."""


def write_user_config(folder: Path) -> Path:
    folder.mkdir()
    (folder / "exp.yaml").write_text(
        "defaults:\n  - config\n  - override algorithm: ppo\n  - _self_\n"
        "run:\n  steps: 7\nalgorithm:\n  lr: 0.002\n", encoding="utf-8")
    return folder


def test_a_user_config_starts_from_the_shipped_one(tmp_path: Path) -> None:
    folder = write_user_config(tmp_path / "conf")
    cfg = from_omegaconf(compose_config(["run.seed=5"], config_dir=folder, config_name="exp"))
    shipped = from_omegaconf(compose_config([]))
    assert cfg.algorithm.name == "ppo" and cfg.run.steps == 7 and cfg.run.seed == 5
    assert cfg.algorithm.lr == 0.002
    assert cfg.model == shipped.model and cfg.data == shipped.data  # the rest as shipped


def test_user_config_errors_name_the_flag(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_user_config(tmp_path / "conf")
    assert main(["--config-dir", str(folder), "--config-name", "nope", "--dry-run"]) == 2
    assert "--config-name nope: no nope.yaml in" in capsys.readouterr().err
    assert main(["--config-dir", str(tmp_path / "missing"), "--dry-run"]) == 2
    assert "--config-dir" in capsys.readouterr().err
    (folder / "bad.yaml").write_text("defaults:\n  - config\n  - _self_\nrun:\n  steps: -1\n",
                                     encoding="utf-8")
    assert main(["--config-dir", str(folder), "--config-name", "bad", "--dry-run"]) == 2
    assert "'run.steps' = -1 is invalid" in capsys.readouterr().err


def test_multirun_dry_run_composes_each_job_in_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_user_config(tmp_path / "conf")
    status = main(["-m", *FIXED, "run.seed=0,1", "--dry-run", "--run-dir", str(tmp_path / "s"),
                   "--config-dir", str(folder), "--config-name", "exp"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "multirun: 2 jobs in" in out
    assert f"multirun job 0 of 2: run.seed=0 -> {tmp_path / 's' / '0'}" in out
    assert f"multirun job 1 of 2: run.seed=1 -> {tmp_path / 's' / '1'}" in out
    assert out.count("\n  steps: 7\n") == 2  # each job from the user's config (YAML)
    assert f"  run_dir: {tmp_path / 's' / '1'}\n" in out
    assert "  0: run.seed=0: ok" in out and "  1: run.seed=1: ok" in out


def test_multirun_checks_every_job_before_the_first_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["-m", *FIXED, "run.steps=2,-1", "--run-dir", str(tmp_path / "s")])
    captured = capsys.readouterr()
    assert status == 2
    assert "'run.steps' = -1 is invalid" in captured.err
    assert "multirun job" not in captured.out and not (tmp_path / "s").exists()


def test_a_sweep_without_multirun_says_to_add_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run.seed=0,1", "--dry-run"]) == 2
    assert "add -m" in capsys.readouterr().err
