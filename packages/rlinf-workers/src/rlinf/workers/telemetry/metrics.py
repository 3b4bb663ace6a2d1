"""Training metrics: a JSONL file (the source of truth) mirrored to TensorBoard scalars and
to experiment trackers (`rlinf.workers.telemetry.trackers`: wandb, mlflow).

Each record is one JSON object per line: ``step``, ``time`` (``time.time()``), then the
metrics. Every write is flushed, so a process killed with SIGKILL loses at most the line it
was writing; a torn last line is dropped the next time the file is opened or read.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import structlog

from rlinf.workers._extras import require
from rlinf.workers.errors import ConfigError
from rlinf.workers.telemetry.trackers import Tracker, open_tracker

__all__ = ["METRICS_FILE", "TENSORBOARD_DIR", "MetricsWriter", "read_metrics"]

METRICS_FILE = "metrics.jsonl"
"""Name of the JSONL file inside a run directory."""
TENSORBOARD_DIR = "tensorboard"
"""Name of the TensorBoard event directory inside a run directory."""

_RESERVED = ("step", "time")
_TB_FLUSH_S = 5
log = structlog.get_logger(__name__)


def _parse_lines(path: Path) -> tuple[list[dict[str, float]], int]:
    """Complete records of `path` and the byte length they occupy (a torn tail excluded)."""
    data = path.read_bytes()
    records: list[dict[str, float]] = []
    good = 0
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:  # the last write was cut before its newline
            break
        line = data[pos:nl].strip()
        if line:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if data.find(b"\n", nl + 1) >= 0 or data[nl + 1:].strip():
                    raise ConfigError(
                        f"{path}: line at byte {pos} is not JSON and is not the last line; "
                        "the metrics file is corrupt, fix or move it"
                    ) from None
                break
            if not isinstance(record, dict):
                raise ConfigError(f"{path}: line at byte {pos} is {type(record).__name__}, "
                                  "expected a JSON object per line")
            records.append(record)
        pos = nl + 1
        good = pos
    return records, good


def read_metrics(path: Path) -> list[dict[str, float]]:
    """All complete records of a metrics JSONL file, in file order (a torn last line is skipped).

    `path` may be the file or the run directory holding ``metrics.jsonl``.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no metrics file at {path}; pass a run directory or its "
                                f"{METRICS_FILE}")
    return _parse_lines(path)[0]


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:  # numpy scalars and 0-d tensors
            value = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"metric {key!r} is {type(value).__name__} {value!r}; "
                              "metrics must be numbers") from None
    return float(value) if not isinstance(value, int) else value  # ints stay exact in JSON


class MetricsWriter:
    """Append per-step metrics to ``run_dir/metrics.jsonl`` and TensorBoard scalars.

    Args:
        run_dir: the run directory (created if missing).
        tensorboard: also write scalars to ``run_dir/tensorboard`` (needs the `telemetry`
            extra).
        resume_step: when resuming from a checkpoint taken before step `resume_step`, drop the
            records with ``step >= resume_step`` (they are about to be redone); TensorBoard
            purges its events past that step likewise.
        trackers: experiment trackers to mirror every record to (``"wandb"``, ``"mlflow"``;
            `open_tracker`), opened under `run_name` with the flat `config` as parameters.
            After a resume from an earlier checkpoint, the redone steps are logged again:
            MLflow's history keeps both values of such a step, wandb keeps the first.
    """

    def __init__(
        self, run_dir: Path, *, tensorboard: bool = True, resume_step: int | None = None,
        trackers: Sequence[str] = (), run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._tb: Any = None
        self._file: IO[str] | None = None
        self._trackers: list[Tracker] = []
        self._prepare(resume_step)
        try:
            for name in trackers:
                self._trackers.append(open_tracker(
                    name, self.run_dir, run_name=run_name or self.run_dir.resolve().name,
                    config=config or {}))
        except BaseException:
            self._close_trackers()
            raise
        if tensorboard:
            tb = require("torch.utils.tensorboard", feature="TensorBoard metrics",
                         extra="telemetry")
            require("tensorboard", feature="TensorBoard metrics", extra="telemetry")
            # TensorBoard is a view (the JSONL file is the record): it flushes every few
            # seconds in the background instead of on every write.
            self._tb = tb.SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD_DIR),
                                        purge_step=resume_step, flush_secs=_TB_FLUSH_S)
        self._file = self.path.open("a", encoding="utf-8")

    def _prepare(self, resume_step: int | None) -> None:
        """Drop a torn last line and, on resume, the records that will be redone."""
        if not self.path.exists():
            return
        records, good = _parse_lines(self.path)
        size = self.path.stat().st_size
        keep = records if resume_step is None else [
            r for r in records if float(r.get("step", -1)) < resume_step]
        if good == size and len(keep) == len(records):
            return
        tmp = self.path.with_suffix(".jsonl.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for r in keep:
                f.write(json.dumps(r) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        log.info("metrics_truncated", path=str(self.path), kept=len(keep),
                 dropped=len(records) - len(keep), torn_tail=good != size)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append one record for `step` and flush it."""
        if self._file is None:
            raise ConfigError(f"MetricsWriter for {self.path} is closed; open a new one")
        clash = [k for k in metrics if k in _RESERVED]
        if clash:
            raise ConfigError(f"metric names {clash} are reserved for the record itself; "
                              "rename them")
        values = {k: _number(k, v) for k, v in metrics.items()}
        record: dict[str, Any] = {"step": int(step), "time": time.time(), **values}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in values.items():
                if math.isfinite(v):
                    self._tb.add_scalar(k, v, global_step=int(step))
        for tracker in self._trackers:
            tracker.log(int(step), values)

    def flush(self) -> None:
        """Push buffered TensorBoard events to disk now (the JSONL file never buffers)."""
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        """Flush and close every output; further writes raise `ConfigError`."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        self._close_trackers()

    def _close_trackers(self) -> None:
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            try:
                tracker.close()
            except Exception:  # a tracker's failure must not lose the other outputs
                log.exception("tracker_close_failed", tracker=type(tracker).__name__)

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
