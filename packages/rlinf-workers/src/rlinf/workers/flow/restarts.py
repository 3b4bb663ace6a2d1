"""`with_restarts`: a run that heals itself when a worker dies.

The flow runtime kills what is left of a flow whose worker died and raises that worker's
`WorkerDiedError`. An app that can resume from its checkpoints hands its session function
here: each time a worker dies the restart is recorded and the session runs again with
``resume=True`` (from the last checkpoint, or from the start before the first one), at most
`max_restarts` times; after that the error propagates. The session gets the restarts so far
to write into its metrics and summary. A worker whose constructor raised is not restarted:
that failure repeats (a bad config, a missing file), so it propagates at once. Nor is a
death that took the whole Ray cluster with it (``ray stop``, the head node lost): with no
cluster to launch on, a `ClusterLostError` ends the run at once, its checkpoints kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO, TypeVar

import structlog

from rlinf.workers.errors import ClusterLostError, WorkerDiedError
from rlinf.workers.runtime.ray_session import cluster_address, cluster_gone
from rlinf.workers.telemetry import CheckpointStore

__all__ = ["with_restarts"]

_log = structlog.get_logger(__name__)

T = TypeVar("T")


def with_restarts(session: Callable[[bool, tuple[str, ...]], T], *, resume: bool,
                  max_restarts: int, checkpoints: CheckpointStore, out: TextIO,
                  unit: str = "step") -> T:
    """``session(resume, restarts)`` until it returns, restarting it after each worker
    death at most `max_restarts` times (module docstring). A restart is described as
    ``"<components> rank <r> died; went on from <unit> <k>"``, k the last checkpoint's step
    (the components of the process that died, `WorkerDiedError.process`)."""
    restarts: list[str] = []
    while True:
        try:
            return session(resume, tuple(restarts))
        except WorkerDiedError as exc:
            if cluster_gone():
                raise ClusterLostError(cluster_address(),
                                       detail=f"{exc.role} rank {exc.rank} went with it") from exc
            if len(restarts) >= max_restarts or exc.method == "__init__":
                raise
            latest = checkpoints.latest()
            step = latest[0] if latest is not None else 0
            restarts.append(f"{exc.process} rank {exc.rank} died; went on from {unit} {step}")
            print(f"worker died ({exc}); restart {len(restarts)} of {max_restarts} from "
                  f"{unit} {step}", file=out, flush=True)
            _log.warning("run_restart", restart=len(restarts), step=step, role=exc.role,
                         rank=exc.rank, error=str(exc))
            resume = True
