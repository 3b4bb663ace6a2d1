"""`AppCLI` on a toy app (a config folder, a dataclass and a train module written here): the
help page, one-line refusals, a user's own config folder, dry runs and sweeps, exit
statuses."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from rlinf.workers.cli import (
    EXIT_CONFIG,
    AppCLI,
    NotAnOverrideError,
    UnknownKeyError,
    UnquotedValueError,
)
from rlinf.workers.errors import ConfigError, InvalidConfigError
from rlinf.workers.schema import build


@dataclass(frozen=True)
class Run:
    steps: int = 2
    """Iterations to train."""
    run_dir: str = "runs/toy"
    """The run folder."""
    seed: int = 0
    """The seed."""


@dataclass(frozen=True)
class Toy:
    algorithm: Literal["ppo", "grpo"] = "ppo"
    """The algorithm."""
    placement: str = "collocated"
    """Where components run."""
    run: Run = field(default_factory=Run)
    """Length and outputs."""


TRAIN = '''
import json
from pathlib import Path


def dry_run(cfg, *, out):
    print(f"plan: {cfg.placement}", file=out)


def train(cfg, *, resume, overrides, ray_started):
    if cfg.run.seed == 13:
        raise KeyboardInterrupt
    folder = Path(cfg.run.run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps({"seed": cfg.run.seed}))
    return {"seed": cfg.run.seed, "resume": resume}
'''


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AppCLI[Toy]:
    conf = tmp_path / "conf"
    (conf / "algorithm").mkdir(parents=True)
    (conf / "config.yaml").write_text(textwrap.dedent("""\
        defaults:
          - algorithm: ppo
          - _self_
        placement: collocated
        run:
          steps: 2
          run_dir: runs/toy
          seed: 0
        """))
    (conf / "algorithm" / "ppo.yaml").write_text("# @package _global_\nalgorithm: ppo\n")
    (conf / "algorithm" / "grpo.yaml").write_text("# @package _global_\nalgorithm: grpo\n")
    (tmp_path / "toy_train.py").write_text(TRAIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_train", raising=False)

    def load(composed: Any) -> Toy:
        from omegaconf import OmegaConf

        return build(Toy, OmegaConf.to_container(composed, resolve=True))  # type: ignore[arg-type]

    return AppCLI(prog="toy", usage="toy: a toy app", conf_dir=conf, schema=Toy, load=load,
                  run_dir_of=lambda cfg: Path(cfg.run.run_dir), train_module="toy_train",
                  sweep_result=lambda folder: (folder / "summary.json").read_text())


def test_the_help_page_lists_flags_groups_and_keys(toy: AppCLI[Toy],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert toy.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("toy: a toy app")
    for flag in ("--dry-run", "--resume", "--run-dir", "--config-dir", "--multirun"):
        assert flag in out
    assert "  algorithm=grpo|ppo" in out
    assert "    run.steps=2  (int)" in out and "        Iterations to train." in out


@pytest.mark.parametrize(("args", "error", "phrase"), [
    (["run.stesp=3"], UnknownKeyError, "did you mean 'run.steps'"),
    (["placement=a, b"], UnquotedValueError, "write \"placement='a, b'\""),
    (["placement=a", "b"], UnquotedValueError, "placement"),
    (["steps"], NotAnOverrideError, "'steps' is not an override"),
    (["run.steps=x"], InvalidConfigError, "'run.steps' = 'x'"),
])
def test_a_bad_command_line_is_one_line_and_exit_2(
        toy: AppCLI[Toy], capsys: pytest.CaptureFixture[str], args: list[str],
        error: type[Exception], phrase: str) -> None:
    with pytest.raises(error) as info:
        toy.load_config(args)
    assert phrase in str(info.value)
    assert toy.main(args) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("toy: config error: ") and err.count("\n") == 1 and phrase in err


def test_a_users_config_folder_sits_in_front_of_the_shipped_one(
        toy: AppCLI[Toy], tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "exp.yaml").write_text("defaults:\n  - config\n  - override algorithm: grpo\n"
                                   "  - _self_\nrun:\n  steps: 7\n")
    cfg = toy.load_config([], config_dir=mine, config_name="exp")
    assert (cfg.algorithm, cfg.run.steps) == ("grpo", 7)
    with pytest.raises(ConfigError, match=r"no nope\.yaml"):
        toy.load_config([], config_dir=mine, config_name="nope")


def test_a_dry_run_prints_the_config_and_the_plan(
        toy: AppCLI[Toy], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert toy.main(["--dry-run", "placement=hybrid", "--run-dir", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "placement: hybrid" in out and "plan: hybrid" in out
    assert f"run_dir: {tmp_path / 'r'}" in out and not (tmp_path / "r").exists()


def test_a_sweep_runs_every_job_in_its_folder_and_tabulates_them(
        toy: AppCLI[Toy], capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import rlinf.workers.flow as flow
    import rlinf.workers.runtime.ray_session as ray_session

    monkeypatch.setattr(flow, "ensure_ray", lambda **_: False)
    monkeypatch.setattr(ray_session, "import_while_ray_starts",
                        lambda module, **_: (__import__(module), False))
    assert toy.main(["-m", "run.seed=1,2", "--run-dir", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert f"multirun job 1 of 2: run.seed=2 -> {tmp_path / 's' / '1'}" in out
    assert '  0: run.seed=1: {"seed": 1}' in out and '  1: run.seed=2: {"seed": 2}' in out
    # an interrupted job stops the sweep with exit 130 and says how to go on
    assert toy.main(["-m", "run.seed=13,14", "--run-dir", str(tmp_path / "t")]) == 130
    said = capsys.readouterr()
    assert "sweep interrupted at job 0" in said.err and "  1: run.seed=14: not run" in said.out
    assert "no checkpoint was written yet" in said.err
