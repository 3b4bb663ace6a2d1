"""Experiment trackers a `MetricsWriter` mirrors its records to: Weights & Biases and MLflow.

The run folder's ``metrics.jsonl`` stays the record; a tracker is a view of it, opened with
the run's name and flat config and closed with the writer. Each keeps its run id in the run
folder, so a resumed run logs into the same tracker run.

- ``wandb``: online when a login is configured (``WANDB_API_KEY`` or ``wandb login``), else
  offline into ``RUN_DIR/wandb`` (no network needed; ``wandb sync RUN_DIR/wandb/offline-run-*``
  uploads it later). ``WANDB_MODE``, ``WANDB_PROJECT`` (default ``rlinf``) and ``WANDB_ENTITY``
  are honoured.
- ``mlflow``: the tracking URI of ``MLFLOW_TRACKING_URI``, else a local file store in
  ``RUN_DIR/mlruns`` (``mlflow ui --backend-store-uri RUN_DIR/mlruns`` shows it; MLflow 3
  keeps that store in maintenance mode, so ``MLFLOW_ALLOW_FILE_STORE=true`` is set for it);
  experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``rlinf``).
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import structlog

from rlinf.workers._extras import require
from rlinf.workers.errors import ConfigError

__all__ = ["TRACKERS", "MlflowTracker", "Tracker", "WandbTracker", "open_tracker"]

log = structlog.get_logger(__name__)

TRACKERS = ("wandb", "mlflow")
"""Tracker names `open_tracker` knows."""

_MLFLOW_PARAM_CHARS = 6000
"""MLflow's limit on one parameter value's length."""


class Tracker(Protocol):
    """Receives each metrics record; closed once at the end of the run."""

    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def _run_id(run_dir: Path, name: str, make: Callable[[], str]) -> tuple[str, bool]:
    """The tracker run id kept in ``run_dir/.<name>-run-id``: (id, whether it existed)."""
    path = run_dir / f".{name}-run-id"
    if path.is_file():
        return path.read_text(encoding="utf-8").strip(), True
    run_id = make()
    path.write_text(run_id + "\n", encoding="utf-8")
    return run_id, False


def _logged_in() -> bool:
    """Whether wandb has credentials (without asking wandb, which may prompt)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text(encoding="utf-8")
    except OSError:
        return False


class WandbTracker:
    """Mirror records to a Weights & Biases run (module docstring)."""

    def __init__(self, run_dir: Path, *, name: str, config: Mapping[str, Any]) -> None:
        wandb = require("wandb", feature="the wandb tracker", extra="wandb")
        mode = os.environ.get("WANDB_MODE") or ("online" if _logged_in() else "offline")
        if mode == "offline" and "WANDB_MODE" not in os.environ:
            log.info("wandb_offline", dir=str(run_dir / "wandb"),
                     why="no wandb login; `wandb sync` uploads the run later")
        run_id, existed = _run_id(run_dir, "wandb", lambda: uuid.uuid4().hex[:12])
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "rlinf"), entity=os.environ.get("WANDB_ENTITY"),
            name=name, id=run_id, resume="allow" if existed else None, dir=str(run_dir),
            config=dict(config), mode=mode, reinit="create_new")
        self._last_step = -1

    def log(self, step: int, values: Mapping[str, float]) -> None:
        if step <= self._last_step:  # wandb drops (and warns about) steps it has seen
            return
        self._run.log({k: v for k, v in values.items() if math.isfinite(v)}, step=step)
        self._last_step = step

    def close(self) -> None:
        self._run.finish()


class MlflowTracker:
    """Mirror records to an MLflow run (module docstring)."""

    def __init__(self, run_dir: Path, *, name: str, config: Mapping[str, Any]) -> None:
        require("mlflow", feature="the mlflow tracker", extra="mlflow")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (run_dir / "mlruns").resolve().as_uri()
            # MLflow 3 keeps its file store in maintenance mode and refuses it unless asked;
            # a database store needs SQLAlchemy, which mlflow-skinny does not bring.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = MlflowClient(tracking_uri=uri)
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "rlinf")
        experiment = self._client.get_experiment_by_name(experiment_name)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self._client.create_experiment(experiment_name))

        def create() -> str:
            return str(self._client.create_run(experiment_id, run_name=name).info.run_id)

        self.run_id, existed = _run_id(run_dir, "mlflow", create)
        if existed:  # resumed: the run is running again
            self._client.update_run(self.run_id, status="RUNNING")
        else:
            params = [Param(key, str(value)[:_MLFLOW_PARAM_CHARS])
                      for key, value in sorted(config.items())]
            for start in range(0, len(params), 100):  # MLflow takes 100 params per batch
                self._client.log_batch(self.run_id, params=params[start:start + 100])
        self.tracking_uri = uri

    def log(self, step: int, values: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric(key, float(value), now, int(step))
                   for key, value in values.items() if math.isfinite(value)]
        for start in range(0, len(metrics), 1000):  # MLflow takes 1000 metrics per batch
            self._client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def open_tracker(name: str, run_dir: Path, *, run_name: str,
                 config: Mapping[str, Any]) -> Tracker:
    """The tracker called `name` (one of `TRACKERS`) for the run in `run_dir`.

    Raises:
        ConfigError: an unknown tracker name.
        MissingExtraError: its package is not installed (names the extra).
    """
    if name == "wandb":
        return WandbTracker(run_dir, name=run_name, config=config)
    if name == "mlflow":
        return MlflowTracker(run_dir, name=run_name, config=config)
    raise ConfigError(f"unknown tracker {name!r}; expected one of {', '.join(TRACKERS)}")
