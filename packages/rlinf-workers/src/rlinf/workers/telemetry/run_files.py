"""What an app's run writes beside its metrics: the loggers it mirrors them to, checked
before the run starts, and ``config.json``, the config it ran with.

Both apps use these, so a run folder reads the same whichever app wrote it.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlinf.workers.errors import ConfigError, MissingExtraError
from rlinf.workers.telemetry.metrics import MetricsWriter

__all__ = ["CONFIG_FILE", "LOGGERS", "check_loggers", "metrics_writer", "write_run_config"]

CONFIG_FILE = "config.json"
"""The run's config (``{"config": {dotted key: value}, "overrides": [...]}``)."""

LOGGERS = ("jsonl", "tensorboard", "wandb", "mlflow")
"""Where metrics go: metrics.jsonl (always), TensorBoard, wandb, MLflow."""

_MODULES = {"tensorboard": ("tensorboard", "telemetry"), "wandb": ("wandb", "wandb"),
            "mlflow": ("mlflow", "mlflow")}
"""Logger → (module it needs, rlinf-workers extra that provides it)."""


def check_loggers(loggers: Sequence[str], *, key: str = "run.loggers") -> None:
    """jsonl kept, each logger known and listed once, and its package installed (found, not
    imported): ConfigError or MissingExtraError naming `key` otherwise."""
    names = list(loggers)
    unknown = [n for n in names if n not in LOGGERS]
    if unknown or "jsonl" not in names or len(set(names)) != len(names):
        raise ConfigError(
            f"{key}={names} must hold jsonl (metrics.jsonl is the run's record: resume and the "
            f"summary read it) and any of tensorboard, wandb, mlflow, each once"
            + (f"; {unknown} are unknown" if unknown else ""))
    for name in names:
        module, extra = _MODULES.get(name, (None, None))
        if module is not None and importlib.util.find_spec(module) is None:
            raise MissingExtraError(f"{key}={names} ({name})", str(extra), module)


def metrics_writer(run_dir: Path, loggers: Sequence[str], *, resume_step: int | None,
                   config: Mapping[str, Any] | None = None) -> MetricsWriter:
    """The run's `MetricsWriter`, mirroring to the `loggers` besides metrics.jsonl, the
    trackers' run named after the run folder's last two parts."""
    return MetricsWriter(run_dir, tensorboard="tensorboard" in loggers, resume_step=resume_step,
                         trackers=[n for n in loggers if n not in ("jsonl", "tensorboard")],
                         run_name="/".join(Path(run_dir).resolve().parts[-2:]), config=config)


def write_run_config(run_dir: Path, config: Mapping[str, Any],
                     overrides: Sequence[str] = ()) -> Path:
    """Write `CONFIG_FILE` in `run_dir`: the flat config and the overrides given."""
    path = Path(run_dir) / CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"config": dict(config), "overrides": list(overrides)},
                               indent=2) + "\n")
    return path
