"""An app run's loggers and config file (`rlinf.workers.telemetry.run_files`)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rlinf.workers.errors import ConfigError, MissingExtraError
from rlinf.workers.telemetry import (
    CONFIG_FILE,
    check_loggers,
    metrics_writer,
    read_metrics,
    write_run_config,
)


@pytest.mark.parametrize(("loggers", "message"), [
    (("tensorboard",), "must hold jsonl"),
    (("jsonl", "jsonl"), "each once"),
    (("jsonl", "comet"), r"\['comet'\] are unknown"),
])
def test_bad_logger_lists_say_what_is_wrong(loggers: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_loggers(loggers, key="run.loggers")


def test_a_tracker_that_is_not_installed_names_its_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"rlinf-workers\[wandb\]"):
        check_loggers(("jsonl", "wandb"))
    check_loggers(("jsonl",))  # nothing optional: fine


def test_the_writer_follows_the_loggers_and_the_config_file_holds_the_overrides(
        tmp_path: Path) -> None:
    with metrics_writer(tmp_path, ("jsonl",), resume_step=None) as writer:
        writer.write(1, {"loss": 0.5})
    assert [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0.5]
    assert not (tmp_path / "tensorboard").exists()
    path = write_run_config(tmp_path / "new", {"run.steps": 3}, ["run.steps=3"])
    assert path.name == CONFIG_FILE
    assert json.loads(path.read_text()) == {"config": {"run.steps": 3},
                                            "overrides": ["run.steps=3"]}
