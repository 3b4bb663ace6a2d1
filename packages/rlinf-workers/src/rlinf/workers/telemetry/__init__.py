"""Run telemetry: metrics, progress, plots, traces, videos, logging setup and checkpoints.

Importing this package is cheap (stdlib, numpy, structlog); TensorBoard, matplotlib and
Pillow (the ``rlinf-workers[telemetry]`` extra) load when a feature needs them, and a
missing one raises `MissingExtraError` naming the extra.

- `MetricsWriter` / `read_metrics`: JSONL records (source of truth) + TensorBoard scalars,
  mirrored to experiment trackers (`trackers`: wandb, offline without a login; mlflow, a
  local file store by default; the ``wandb`` and ``mlflow`` extras).
- `ProgressDisplay`: step/total, rate, ETA and a few metrics; live on a TTY, periodic lines
  elsewhere.
- `plot_learning_curve`, `plot_timeline`: PNGs of metric records and of measured vs
  predicted timelines.
- `Span`, `TraceRecorder`, `write_chrome_trace`, `predicted_spans`, `write_run_trace`:
  Chrome-trace timelines from workers, side by side with the planner's simulated iteration.
- `write_video`: GIF (Pillow) or MP4 (imageio-ffmpeg) from uint8 frames.
- `configure_logging`: structlog + stdlib, console or JSON lines, once per process.
- `CheckpointStore`: atomic step directories with a LATEST pointer and pruning.
- `check_loggers`, `metrics_writer`, `write_run_config`: an app run's loggers (checked before
  it starts) and its ``config.json``.
"""

from rlinf.workers.telemetry.checkpoints import CheckpointStore
from rlinf.workers.telemetry.logging import configure_logging
from rlinf.workers.telemetry.metrics import MetricsWriter, read_metrics
from rlinf.workers.telemetry.plots import plot_learning_curve, plot_timeline
from rlinf.workers.telemetry.progress import ProgressDisplay
from rlinf.workers.telemetry.run_files import (
    CONFIG_FILE,
    LOGGERS,
    check_loggers,
    metrics_writer,
    write_run_config,
)
from rlinf.workers.telemetry.trace import (
    Span,
    TraceRecorder,
    predicted_spans,
    write_chrome_trace,
    write_run_trace,
)
from rlinf.workers.telemetry.trackers import TRACKERS, open_tracker
from rlinf.workers.telemetry.video import write_video

__all__ = [
    "CONFIG_FILE",
    "LOGGERS",
    "TRACKERS",
    "CheckpointStore",
    "MetricsWriter",
    "ProgressDisplay",
    "Span",
    "TraceRecorder",
    "check_loggers",
    "configure_logging",
    "metrics_writer",
    "open_tracker",
    "plot_learning_curve",
    "plot_timeline",
    "predicted_spans",
    "read_metrics",
    "write_chrome_trace",
    "write_run_config",
    "write_run_trace",
    "write_video",
]
