"""Telling a dead worker from a dead cluster: `cluster_reachable`, `cluster_gone` and
`ClusterWatch` against a listening and a closed port, and `with_restarts` refusing to restart
on a lost cluster, also one whose control store closes after the worker's death is seen."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from rlinf.workers.errors import ClusterLostError, WorkerDiedError
from rlinf.workers.flow.restarts import with_restarts
from rlinf.workers.runtime import ray_session
from rlinf.workers.runtime.ray_session import (
    ClusterWatch,
    cluster_gone,
    cluster_reachable,
    local_ray_instance,
    local_system_config,
    raylet_addresses,
    unreachable,
)
from rlinf.workers.telemetry import CheckpointStore


@pytest.fixture
def listening() -> Iterator[str]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def closed() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"  # nobody listens once it is closed


@pytest.fixture(autouse=True)
def remembered(monkeypatch: pytest.MonkeyPatch) -> ray_session._Connection:
    connection = ray_session._Connection()
    monkeypatch.setattr(ray_session, "_last", connection)
    return connection


def test_a_cluster_is_reachable_while_its_gcs_and_raylet_listen(
        remembered: ray_session._Connection, listening: str, closed: str) -> None:
    assert cluster_reachable()  # nothing connected yet: nothing known to be lost
    remembered.address = remembered.raylet = listening
    assert cluster_reachable()
    remembered.raylet = closed  # ray stop takes the raylets first
    assert not cluster_reachable()
    remembered.raylet, remembered.address = listening, closed
    assert not cluster_reachable()


def test_a_local_instance_shut_down_by_its_starter_is_not_lost(
        remembered: ray_session._Connection, closed: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Shut down here, whatever Ray another test module of this session has running.
    monkeypatch.setattr(ray_session.ray, "is_initialized", lambda: False)
    remembered.address = remembered.raylet = closed
    remembered.started_here = True  # ray.init started it; the session's end stopped it
    assert cluster_reachable()
    remembered.started_here = False  # a cluster joined by address: gone means lost
    assert not cluster_reachable()


def test_the_watch_raises_once_the_cluster_stayed_away_for_its_grace(
        remembered: ray_session._Connection, listening: str, closed: str) -> None:
    remembered.address = listening
    watch = ClusterWatch(grace=0.3, period=0.05)
    watch.check()
    remembered.address = closed
    started = time.monotonic()
    with pytest.raises(ClusterLostError, match="gone or unreachable") as lost:
        while time.monotonic() - started < 5:
            watch.check()
            time.sleep(0.01)
    # Not before its grace (how much later is the machine's business: the loop bounds it).
    assert time.monotonic() - started >= 0.3
    assert lost.value.address == closed


def test_a_worker_death_on_a_lost_cluster_is_not_restarted(
        remembered: ray_session._Connection, closed: str, tmp_path) -> None:
    calls: list[bool] = []

    def session(resume: bool, restarts: tuple[str, ...]) -> None:
        calls.append(resume)
        raise WorkerDiedError("actor", 0, method="run_entry")

    remembered.address = closed
    out = io.StringIO()
    with pytest.raises(ClusterLostError, match="actor rank 0 went with it"):
        with_restarts(session, resume=False, max_restarts=3,
                      checkpoints=CheckpointStore(tmp_path), out=out)
    assert calls == [False] and "restart" not in out.getvalue()


def _close_after(server: socket.socket, seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, server.close)
    timer.start()
    return timer


def test_a_cluster_that_closes_within_the_settle_time_is_gone(
        remembered: ray_session._Connection, listening: str) -> None:
    remembered.address = listening
    started = time.monotonic()
    assert not cluster_gone(settle=0.4)  # stays up: judged after the settle time
    assert time.monotonic() - started >= 0.4  # a hang is pytest-timeout's to catch
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        remembered.address = f"127.0.0.1:{server.getsockname()[1]}"
        timer = _close_after(server, 0.3)
        assert cluster_gone(settle=2.0)
        timer.join()


def test_a_death_seen_before_ray_stop_closed_the_gcs_is_not_restarted(
        remembered: ray_session._Connection, tmp_path) -> None:
    """``ray stop`` SIGTERMs workers and daemons together: the worker's death arrives while
    the GCS still listens, and a restart then would block on it until Ray aborts."""
    calls: list[bool] = []
    with socket.socket() as gcs:
        gcs.bind(("127.0.0.1", 0))
        gcs.listen()
        remembered.address = f"127.0.0.1:{gcs.getsockname()[1]}"

        def session(resume: bool, restarts: tuple[str, ...]) -> None:
            calls.append(resume)
            _close_after(gcs, 0.3)  # the daemons go a moment after their worker
            raise WorkerDiedError("actor", 0, method="run_entry")

        out = io.StringIO()
        with pytest.raises(ClusterLostError, match="actor rank 0 went with it"):
            with_restarts(session, resume=False, max_restarts=3,
                          checkpoints=CheckpointStore(tmp_path), out=out)
    assert calls == [False] and "restart" not in out.getvalue()


def test_raylet_addresses_are_those_of_the_wanted_live_nodes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = [{"NodeID": "up", "Alive": True, "NodeManagerAddress": "10.0.0.1",
              "NodeManagerPort": 4100},
             {"NodeID": "dead", "Alive": False, "NodeManagerAddress": "10.0.0.2",
              "NodeManagerPort": 4100},
             {"NodeID": "unaddressed", "Alive": True},
             {"NodeID": "other", "Alive": True, "NodeManagerAddress": "10.0.0.3",
              "NodeManagerPort": 4100}]
    monkeypatch.setattr(ray_session.ray, "nodes", lambda: nodes)
    assert raylet_addresses(["up", "dead", "unaddressed", "unknown"]) == {
        "up": "10.0.0.1:4100"}


def test_raylet_addresses_are_empty_when_ray_does_not_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def down() -> list[dict[str, object]]:
        raise ConnectionError("GCS unreachable")

    monkeypatch.setattr(ray_session.ray, "nodes", down)
    assert raylet_addresses(["up"]) == {}


def test_an_address_is_unreachable_when_it_refuses_or_is_malformed(
        listening: str, closed: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_gcs() -> None:
        raise AssertionError("the probe must not ask the GCS")

    monkeypatch.setattr(ray_session.ray, "nodes", no_gcs)
    assert unreachable([listening, closed, "no-port"]) == {closed, "no-port"}
    assert unreachable([]) == set()


_CPUS_OF_THE_CLUSTER = """
import os, ray
ray.init()
@ray.remote(num_cpus=0.1)
def nice():
    return os.nice(0)
print(int(ray.cluster_resources()['CPU']), ray.get(nice.remote()))
"""


def test_a_local_ray_instance_is_shared_by_drivers_and_gone_after_the_block() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    with local_ray_instance(num_cpus=3, env=env) as address:
        host, port = address.rsplit(":", 1)
        driver = subprocess.run([sys.executable, "-c", _CPUS_OF_THE_CLUSTER],
                                env={**env, "RAY_ADDRESS": address}, capture_output=True,
                                text=True, timeout=120, check=True)
        # the helper's instance, joined; its workers at the drivers' niceness
        assert driver.stdout.strip().splitlines()[-1] == f"3 {os.nice(0)}"
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2).close()


def test_a_helper_that_cannot_start_ray_is_a_cluster_lost_error() -> None:
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:1"}  # nothing listens there
    with pytest.raises(ClusterLostError, match="did not start Ray"), local_ray_instance(env=env):
        pass


_IDLE_PROBE = """
import time, psutil, ray
from rlinf.workers.runtime.ray_session import ensure_ray
assert ensure_ray(num_cpus=2)
mine = psutil.Process()
# Ray starts its idle workers right after the driver connects; look for a while (an absence
# cannot be awaited), then once an actor exists (its worker must not be counted as idle).
@ray.remote(num_cpus=0.1)
class Probe:
    def ping(self): return 1
    def nice(self):
        import os
        return os.nice(0)
probe = Probe.remote()
ray.get(probe.ping.remote())
idle = 0
for _ in range(20):
    idle = max(idle, sum("ray::IDLE" in " ".join(p.cmdline())
                         for p in mine.children(recursive=True) if p.is_running()))
    time.sleep(0.1)
print(idle, ray.get(probe.nice.remote()))
ray.shutdown()
"""


def test_a_local_instance_starts_no_idle_workers_and_runs_its_workers_at_nice_0() -> None:
    # Ray's default runs workers (the flow's ranks) at nice 15, preempted by anything else.
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_worker_niceness")}
    proc = subprocess.run([sys.executable, "-c", _IDLE_PROBE], capture_output=True, text=True,
                          env={**env, "RAY_AUTH_MODE": "disabled",
                               "RAY_USAGE_STATS_ENABLED": "0"}, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == f"0 {os.nice(0)}"


_STOP_PROBE = """
import psutil, ray
from ray._private import worker
from rlinf.workers.runtime.ray_session import ensure_ray, stop_ray
assert ensure_ray(num_cpus=1)
monitor = worker._global_node.all_processes["monitor"][0].process
started = psutil.Process().children(recursive=True)
stop_ray()
left = [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
print(monitor.returncode, len(left), ray.is_initialized())
"""


def test_stop_ray_kills_the_monitor_first_and_leaves_no_process_of_ray() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", _STOP_PROBE], capture_output=True, text=True,
                          env={**env, "RAY_AUTH_MODE": "disabled",
                               "RAY_USAGE_STATS_ENABLED": "0"}, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # SIGKILL (not the SIGTERM Ray sends and the monitor sits out), and nothing left.
    assert proc.stdout.strip().splitlines()[-1] == f"{-signal.SIGKILL} 0 False"


_IMPORT_PROBE = """
import sys, ray
from rlinf.workers.runtime.ray_session import import_while_ray_starts, stop_ray
try:
    import_while_ray_starts("rlinf_no_such_module", num_cpus=1)
except ModuleNotFoundError:
    print("failed", ray.is_initialized())  # the Ray it started for the import is stopped
module, started = import_while_ray_starts("json", num_cpus=1)
print(module.__name__, started, ray.is_initialized())
module, started = import_while_ray_starts("csv")  # connected already: not started here
print(module.__name__, started)
stop_ray()
"""


def test_a_module_imports_while_ray_starts_and_a_failed_import_stops_that_ray() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", _IMPORT_PROBE], capture_output=True,
                          text=True, env={**env, "RAY_AUTH_MODE": "disabled",
                                          "RAY_USAGE_STATS_ENABLED": "0",
                                          "RLINF_BACKEND": "ray"},  # else no Ray on one machine
                          timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:3] == ["failed False", "json True True", "csv False"]


def test_a_users_worker_niceness_is_left_to_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    assert local_system_config()["worker_niceness"] == 0
    monkeypatch.setenv("RAY_worker_niceness", "10")
    assert "worker_niceness" not in local_system_config()
    assert local_system_config()["enable_worker_prestart"] is False
