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
from rlinf.workers.env.pixels import PixelObservation, make_pixel_env
from rlinf.workers.env.state import capture_env_state, restore_env_state
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
    "PixelObservation",
    "Trajectory",
    "TrajectoryBuilder",
    "capture_env_state",
    "make_pixel_env",
    "restore_env_state",
    "stage_key",
]
