"""`ExportCommand`: one layout for every app's ``export``, a refusal in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlinf.workers.cli import EXIT_CONFIG, ExportCommand
from rlinf.workers.errors import ConfigError


def test_export_passes_the_run_step_folder_and_flags(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    calls = []

    def write(run_dir: Path, out: Path, *, step: int | None, merge: bool) -> Path:
        calls.append((run_dir, out, step, merge))
        return out / "model"

    command = ExportCommand("writes a model", write, flags={"merge": "merge it"})
    assert command.main("app", ["runs/a", "--out", str(tmp_path), "--step", "3",
                                "--merge"]) == 0
    assert calls == [(Path("runs/a"), tmp_path, 3, True)]
    assert capsys.readouterr().out.strip() == f"exported to {tmp_path / 'model'}"


def test_a_refused_export_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def write(run_dir: Path, out: Path, *, step: int | None) -> Path:
        raise ConfigError(f"{run_dir} holds no checkpoint")

    assert ExportCommand("x", write).main("app", ["runs/b", "--out", "o"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err == "app export: config error: runs/b holds no checkpoint\n"
