"""The env worker: vectorized simulators split into pipeline stages, talking to a policy
worker through a sink/source pair (an rlinf.comm Channel or an in-process `KeyedQueue`)."""

from rlinf.workers.env.config import EnvWorkerConfig
from rlinf.workers.env.link import (
    ActionSource,
    KeyedQueue,
    LinkClosedError,
    LinkTimeoutError,
    ObsSink,
    stage_key,
)
from rlinf.workers.env.trajectory import Trajectory, TrajectoryBuilder
from rlinf.workers.env.worker import EnvRollout, EnvWorker

__all__ = [
    "ActionSource",
    "EnvRollout",
    "EnvWorker",
    "EnvWorkerConfig",
    "KeyedQueue",
    "LinkClosedError",
    "LinkTimeoutError",
    "ObsSink",
    "Trajectory",
    "TrajectoryBuilder",
    "stage_key",
]
