"""This driver's connection to Ray, and whether the cluster behind it is still there.

A worker that dies is restarted (`with_restarts`); a cluster that is gone (``ray stop``, the
head node lost) is not a worker death: nothing can be launched again until someone starts
Ray. `ensure_ray` remembers the addresses of the cluster's control store (GCS) and of this
node's raylet, and `cluster_reachable` tells the two cases apart with a TCP connect to each:
``ray stop`` takes the raylets (and with them every worker) first and the GCS seconds later,
so a worker death that came with its raylet's is already known for what it is.
"""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import structlog

from rlinf.workers.errors import ClusterLostError
from rlinf.workers.runtime.backend import start_runtime

if TYPE_CHECKING:
    import ray
else:  # imported on use: a run of local ranks never needs it
    from rlinf.workers.runtime.lazy_ray import ray

__all__ = ["ClusterWatch", "cluster_address", "cluster_gone", "cluster_reachable", "ensure_ray",
           "import_while_ray_starts", "local_ray_instance", "local_system_config",
           "raylet_addresses", "stop_ray", "unreachable"]

_log = structlog.get_logger(__name__)


@dataclass
class _Connection:
    address: str | None = None
    """``host:port`` of the GCS this process last connected to (None: not connected yet);
    kept after ``ray.shutdown`` so a restart can tell whether the cluster is still there."""
    raylet: str | None = None
    """``host:port`` of this node's raylet (its node manager), likewise."""
    started_here: bool = False
    """Whether this process started that instance (``ray.init`` without a cluster to join):
    once it shut it down itself, its absence is no loss (a restart starts a fresh one)."""


_last = _Connection()


def local_system_config() -> dict[str, bool | int]:
    """Ray's system config of a local instance this process starts:

    - no worker processes started ahead of demand. Ray would start one idle worker per CPU
      for the driver (each spending CPU on importing Ray), which no flow uses (its ranks
      carry their own environment) and which compete for the cores with the processes a run
      does start;
    - workers at nice 0, as the driver and local ranks run, unless ``RAY_worker_niceness``
      says otherwise. Ray starts its workers, and so the flow's ranks, at nice 15: on a
      machine shared with anything else, every process at nice 0 preempts them, and ranks
      that synchronise (a data-parallel actor's gradient all-reduce) wait on the one
      preempted (benchmarks/RESULTS.md, bench-reasoning)."""
    config: dict[str, bool | int] = {"prestart_worker_first_driver": False,
                                     "enable_worker_prestart": False}
    if "RAY_worker_niceness" not in os.environ:
        config["worker_niceness"] = 0
    return config


def ensure_ray(**options: Any) -> bool:
    """Start a local Ray instance, or connect to ``RAY_ADDRESS`` when it is set, unless this
    process is connected already; returns whether it connected (whoever did shuts it
    down). `options` go to ``ray.init`` (default: no dashboard, worker logs not forwarded,
    Ray's logging left alone, and a local instance starts no idle workers). A cluster that
    cannot be reached is a `ClusterLostError`."""
    if ray.is_initialized():
        _remember()
        return False
    settings = {"include_dashboard": False, "log_to_driver": False,
                "configure_logging": False, **options}
    if not (settings.get("address") or os.environ.get("RAY_ADDRESS")):
        settings["_system_config"] = {**local_system_config(),
                                      **dict(settings.get("_system_config") or {})}
    try:
        ray.init(**settings)
    except ConnectionError as exc:
        raise ClusterLostError(None, detail=str(exc)) from exc
    _remember()
    return True


def import_while_ray_starts(module: str, *, preload: Iterable[str] = (), **options: Any
                            ) -> tuple[ModuleType, bool]:
    """Import `module` on a thread while this thread starts the run's backend
    (`rlinf.workers.runtime.backend.start_runtime`: Ray with `options`, or the local fork
    server, which imports `preload` for the worker processes): a driver's imports (torch,
    the roles: seconds of CPU) overlap Ray's start, which mostly waits for the processes it
    spawns, or the server's imports. Returns the module and whether Ray was started here
    (the caller then owns it: `stop_ray` at its end). The import's error is raised here,
    after stopping a Ray started for it."""
    failed: list[BaseException] = []

    def load() -> None:
        try:
            importlib.import_module(module)
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    loader = threading.Thread(target=load, name="rlinf-import", daemon=True)
    loader.start()
    try:
        started = start_runtime(preload, **options)
    finally:
        loader.join()
    if failed:
        if started:  # nothing will run on it
            stop_ray()
        raise failed[0]
    return importlib.import_module(module), started


def stop_ray() -> None:
    """``ray.shutdown()``, without its wait on the autoscaler monitor of an instance this
    process started. Ray stops its processes one after another, giving each a second to
    exit on SIGTERM; the monitor (a Python process with nothing to save on a local
    instance) takes all of it, a second at the end of every run. It is killed first."""
    try:
        from ray._private import ray_constants
        from ray._private import worker as ray_worker

        node = ray_worker._global_node
        monitors: Iterable[Any] = node.all_processes.get(
            ray_constants.PROCESS_TYPE_MONITOR, ()) if node is not None else ()
    except (ImportError, AttributeError):  # private: a Ray without them stops as usual
        monitors = ()
    for info in monitors:
        if info.process.poll() is None:
            info.process.kill()
    ray.shutdown()


_HELPER = """
import sys, ray
from rlinf.workers.runtime.ray_session import local_system_config
ray.init(num_cpus=int(sys.argv[1]), include_dashboard=False, log_to_driver=False,
         configure_logging=False, _system_config=local_system_config())
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
from rlinf.workers.runtime.ray_session import stop_ray
stop_ray()
"""


@contextmanager
def local_ray_instance(*, num_cpus: int = 8, env: Mapping[str, str] | None = None,
                       shutdown_timeout: float = 120.0) -> Iterator[str]:
    """A local Ray instance owned by a helper process for the block, yielding its GCS
    address: several driver processes (CLI runs with ``RAY_ADDRESS`` set to it) share it
    instead of each starting and stopping Ray. Not owned by the calling
    process, so it can still `ray.init` one of its own. Closing the helper's stdin shuts the
    instance down; a helper that cannot start Ray is a `ClusterLostError`."""
    helper = subprocess.Popen([sys.executable, "-c", _HELPER, str(num_cpus)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(env) if env is not None else None)
    assert helper.stdin is not None and helper.stdout is not None
    try:
        address = helper.stdout.readline().strip()
        if not address:
            raise ClusterLostError(None, detail="the helper process did not start Ray "
                                   f"(exit code {helper.poll()})")
        yield address
    finally:
        helper.stdin.close()
        try:
            helper.wait(timeout=shutdown_timeout)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()


def cluster_address() -> str | None:
    """``host:port`` of the cluster `ensure_ray` last connected to (None: never)."""
    return _last.address


def cluster_reachable(timeout: float = 2.0) -> bool:
    """Whether the cluster `ensure_ray` connected to still accepts connections at its GCS
    and at this node's raylet (True when there is none to check: never connected, or a
    local instance this process started and has shut down)."""
    if _last.started_here and not ray.is_initialized():
        return True
    for address in (_last.address, _last.raylet):
        if address is None:
            continue
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                pass
        except (OSError, ValueError) as exc:
            _log.warning("ray_cluster_unreachable", address=address, error=str(exc))
            return False
    return True


def raylet_addresses(node_ids: Iterable[str]) -> dict[str, str]:
    """``host:port`` of the raylet of each of the Ray nodes `node_ids` that Ray lists alive
    (asks the GCS once: call it while the cluster is there, e.g. at launch)."""
    wanted = set(node_ids)
    try:
        nodes = ray.nodes()
    except Exception as exc:  # no answer: nothing to record, nothing will be probed
        _log.debug("ray_nodes_unavailable", error=str(exc))
        return {}
    return {str(n["NodeID"]): f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}"
            for n in nodes if str(n.get("NodeID")) in wanted and n.get("Alive")
            and n.get("NodeManagerAddress") and n.get("NodeManagerPort")}


def unreachable(addresses: Iterable[str], *, timeout: float = 0.5) -> set[str]:
    """Which of the ``host:port`` `addresses` refuse (or time out) a TCP connect. A lost
    node's raylet refuses at once, while Ray declares the node dead only after it missed
    several health checks (seconds to tens of seconds) and until then tells no one that the
    actors on it died. No call to the GCS, which may be going away too."""
    refused = set()
    for address in set(addresses):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                pass
        except (OSError, ValueError):
            refused.add(address)
    return refused


def cluster_gone(settle: float = 2.0) -> bool:
    """Whether the cluster stopped answering, now or within `settle` seconds. For a worker
    death about to be healed: ``ray stop`` SIGTERMs workers, raylets and the GCS together,
    and the worker's death can be seen before the daemons have closed their ports; a
    restart launched then would block a minute on the dead GCS, and Ray would abort."""
    if _last.address is None and _last.raylet is None:
        return False  # never connected: nothing to lose
    deadline = time.monotonic() + settle
    while True:
        if not cluster_reachable(timeout=0.5):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


class ClusterWatch:
    """For a driver's wait loop: `check` raises `ClusterLostError` once the cluster has not
    accepted a connection for `grace` seconds, probing at most once per `period`. Ray's own
    driver would wait a minute for a dead control store and then abort the process, with
    no word of which run or what to do; this ends the run in seconds instead."""

    def __init__(self, *, grace: float = 3.0, period: float = 1.0) -> None:
        self.grace = grace
        self.period = period
        self._next_probe = time.monotonic() + period  # a call done within it costs nothing
        self._unreachable_since: float | None = None

    def check(self) -> None:
        now = time.monotonic()
        if now < self._next_probe:
            return
        self._next_probe = now + self.period
        if cluster_reachable(timeout=min(self.period, 0.5)):
            self._unreachable_since = None
            return
        if self._unreachable_since is None:
            self._unreachable_since = now
        elif now - self._unreachable_since >= self.grace:
            raise ClusterLostError(cluster_address(),
                                   detail=f"no answer from its control store (GCS) or this "
                                          f"node's raylet for "
                                          f"{now - self._unreachable_since:.0f} s")


def _remember() -> None:
    """Record the GCS and raylet addresses of the connected cluster (kept as they were when
    Ray does not tell: an older Ray, or a client connection). Every launch calls this; the
    node table is asked only when the cluster is not the one already recorded."""
    try:
        context = ray.get_runtime_context()
        gcs = context.gcs_address
        if gcs and str(gcs) == _last.address and _last.raylet is not None:
            return
        node_id = context.get_node_id()
        node = next((n for n in ray.nodes() if n.get("NodeID") == node_id), None)
    except Exception:
        return
    if gcs:
        _last.address = str(gcs)
    # Ray says so only on its node object (`head`: ray.init started the instance).
    _last.started_here = bool(getattr(getattr(ray._private.worker, "_global_node", None),
                                      "head", False))
    if node is not None and node.get("NodeManagerPort"):
        _last.raylet = f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
