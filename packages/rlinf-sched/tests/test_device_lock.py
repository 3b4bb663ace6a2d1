"""Device lock: mutual exclusion across processes, re-entrancy, FIFO, context switching,
holder death (SIGKILL), timeouts, ordered multi-device acquisition."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rlinf.comm.wire import new_token
from rlinf.sched import DeviceLockError, DeviceLockTimeoutError, HolderDiedError
from rlinf.sched.context_switch import CallbackOnloadable
from rlinf.sched.device_lock import DeviceLockClient, DeviceLockServer
from rlinf.sched.profiler import Profiler

WORKER = Path(__file__).with_name("_lock_worker.py")


@pytest.fixture
def token() -> bytes:
    return new_token()


@pytest.fixture
def server(token: bytes) -> Iterator[DeviceLockServer]:
    with DeviceLockServer(token=token, num_devices=4) as srv:
        yield srv


@pytest.fixture
def connect(server: DeviceLockServer, token: bytes) -> Iterator[Callable[..., DeviceLockClient]]:
    clients: list[DeviceLockClient] = []

    def make(owner: str, **kw: object) -> DeviceLockClient:
        client = DeviceLockClient(server.address, token=token, owner=owner, **kw)  # type: ignore[arg-type]
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def wait_until(predicate: Callable[[], bool], what: str, limit: float = 30.0) -> None:
    """Poll server state (an event we cannot await directly); fail after `limit` seconds."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def waiting_on(server: DeviceLockServer, device: int) -> list[str]:
    for entry in server.state():
        if entry["device"] == device:
            return list(entry["waiting"])
    return []


def spawn(server: DeviceLockServer, token: bytes, **plan: object) -> subprocess.Popen[str]:
    env = {**os.environ, "RLINF_COMM_TOKEN": token.hex()}
    plan = {"address": list(server.address), **plan}
    return subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(plan)], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def test_mutual_exclusion_and_context_switches_across_processes(
    server: DeviceLockServer, token: bytes, tmp_path: Path
) -> None:
    log, counter = tmp_path / "log", tmp_path / "counter"
    counter.write_text("0")
    iterations = 15
    procs = [
        spawn(server, token, owner=f"w{i}", component=comp, devices=[0], log=str(log),
              counter=str(counter), iterations=iterations, mode="loop")
        for i, comp in enumerate(["actor", "rollout", "actor"])
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert int(counter.read_text()) == 3 * iterations  # no lost update: exclusive

    events = [line.split() for line in log.read_text().splitlines()]
    inside: str | None = None
    resident: set[str] = set()  # owners whose component is onloaded on device 0
    runs = 0
    last_owner = None
    for owner, _component, what in events:
        if what == "onload":
            assert inside is None and not resident, f"onload while {resident} resident"
            resident.add(owner)
        elif what == "offload":
            assert inside is None and resident <= {owner}
            resident.discard(owner)
        elif what == "gone":  # it may still be evicted (a no-op for a departing process)
            resident.discard(owner)
        elif what == "enter":
            assert inside is None, f"{owner} entered while {inside} was inside"
            assert resident == {owner}, "entered without being onloaded"
            inside = owner
            runs += owner != last_owner
            last_owner = owner
        else:
            assert inside == owner
            inside = None
    onloads = sum(1 for e in events if e[2] == "onload")
    # The offload/onload pair is skipped exactly when the same owner re-enters next.
    assert onloads == runs
    assert sum(1 for e in events if e[2] == "enter") == 3 * iterations


def test_closing_during_an_offload_waits_for_it_before_the_device_moves_on(
    connect: Callable[..., DeviceLockClient],
) -> None:
    # The race behind a CI failure: a process closed its client while its reader thread ran
    # an offload; the server took the goodbye as the end of that offload and onloaded the
    # next owner while the departing one was still offloading.
    events: list[str] = []
    offloading = threading.Event()

    def slow_offload() -> None:
        offloading.set()
        time.sleep(0.3)
        events.append("a offload")

    a, b = connect("a"), connect("b")
    a.register("actor", CallbackOnloadable(lambda: events.append("a onload"), slow_offload))
    b.register("rollout", CallbackOnloadable(lambda: events.append("b onload"), lambda: None))
    with a.hold(0, component="actor", timeout=5):
        pass  # the actor stays resident after release
    granted: list[object] = []
    waiter = threading.Thread(target=lambda: granted.append(
        b.acquire(0, component="rollout", timeout=10)))
    waiter.start()
    assert offloading.wait(10), "the server never asked a to offload"
    a.close()
    waiter.join(15)
    assert granted, "b was never granted the device"
    assert events == ["a onload", "a offload", "b onload"]


def test_reentrant_for_the_holder(connect: Callable[..., DeviceLockClient]) -> None:
    a, b = connect("a"), connect("b")
    a.acquire(0, component="actor", timeout=5)
    a.acquire(0, component="actor", timeout=5)  # re-entry: no deadlock with itself
    a.release(0)
    with pytest.raises(DeviceLockTimeoutError, match="held by 'a'"):
        b.acquire(0, component="rollout", timeout=0.2)  # a still holds one level
    a.release(0)
    grant = b.acquire(0, component="rollout", timeout=5)
    assert grant.devices == (0,)
    with pytest.raises(DeviceLockError, match="does not hold"):
        a.release(0)


def test_fifo_order(server: DeviceLockServer, connect: Callable[..., DeviceLockClient]) -> None:
    holder = connect("holder")
    holder.acquire(1, component="actor", timeout=5)
    order: list[str] = []
    threads = []
    names = [f"waiter{i}" for i in range(4)]
    for i, name in enumerate(names):
        client = connect(name)

        def run(client: DeviceLockClient = client, name: str = name) -> None:
            client.acquire(1, component="rollout", timeout=60)
            order.append(name)
            client.release(1)

        t = threading.Thread(target=run)
        t.start()
        threads.append(t)
        wait_until(lambda i=i: len(waiting_on(server, 1)) == i + 1, f"{name} to queue")
    assert waiting_on(server, 1) == names
    holder.release(1)
    for t in threads:
        t.join(timeout=60)
    assert order == names


def test_holder_killed_releases_and_waiter_is_told(
    server: DeviceLockServer, token: bytes, tmp_path: Path, connect: Callable[..., DeviceLockClient]
) -> None:
    proc = spawn(server, token, owner="doomed", component="env", devices=[2, 3],
                 log=str(tmp_path / "log"), mode="hold")
    assert proc.stdout is not None
    for line in proc.stdout:  # the worker may log to stdout before it holds the lock
        if line.strip() == "HOLDING":
            break
    else:
        raise AssertionError(f"worker exited without holding: {proc.stderr.read()}")
    waiter = connect("survivor")
    result: dict[str, object] = {}

    def wait() -> None:
        try:
            result["grant"] = waiter.acquire([2, 3], component="actor", timeout=60)
        except Exception as exc:
            result["error"] = exc

    t = threading.Thread(target=wait)
    t.start()
    wait_until(lambda: waiting_on(server, 2) == ["survivor"], "the waiter to queue")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    t.join(timeout=60)
    grant = result.get("grant")
    assert grant is not None, result
    assert grant.devices == (2, 3)  # type: ignore[attr-defined]
    deaths = {(d.device, d.owner, d.component) for d in grant.holder_died}  # type: ignore[attr-defined]
    assert deaths == {(2, "doomed", "env"), (3, "doomed", "env")}
    with pytest.raises(HolderDiedError, match="doomed"):
        grant.raise_if_holder_died()  # type: ignore[attr-defined]
    waiter.release([2, 3])
    # The notice goes to the next grantee only.
    assert waiter.acquire(2, component="actor", timeout=5).holder_died == ()


def test_timeout_names_the_holder_and_leaves_nothing_held(
    server: DeviceLockServer, connect: Callable[..., DeviceLockClient]
) -> None:
    a, b = connect("a"), connect("b")
    a.acquire(1, component="actor", timeout=5)
    with pytest.raises(DeviceLockTimeoutError) as info:
        b.acquire([0, 1], component="rollout", timeout=0.2)
    message = str(info.value)
    assert "device 1" in message and "held by 'a' (actor)" in message
    assert isinstance(info.value, TimeoutError)
    state = {e["device"]: e for e in server.state()}
    assert state[0]["holder"] is None  # device 0, taken first, was given back
    assert state[1]["waiting"] == []


def test_ordered_multi_device_acquisition_does_not_deadlock(
    connect: Callable[..., DeviceLockClient]
) -> None:
    errors: list[BaseException] = []
    count = [0]

    def run(name: str, devices: list[int]) -> None:
        client = connect(name)
        try:
            for _ in range(40):
                with client.hold(devices, component=name, timeout=30):
                    count[0] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n, d)) for n, d in
               [("x", [0, 1]), ("y", [1, 0]), ("z", [1, 2, 0])]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert count[0] == 120


def test_context_switch_hooks_and_switch_times_in_profiler(
    connect: Callable[..., DeviceLockClient]
) -> None:
    log: list[str] = []
    profiler = Profiler(track_memory=False)
    a = connect("a", profiler=profiler)
    b = connect("b")
    a.register("actor", CallbackOnloadable(lambda: log.append("actor+"),
                                           lambda: log.append("actor-")))
    b.register("rollout", CallbackOnloadable(lambda: log.append("rollout+"),
                                             lambda: log.append("rollout-")))
    with a.hold(0, component="actor", timeout=5) as first:
        assert first.onload_seconds >= 0
    with a.hold(0, component="actor", timeout=5) as again:
        assert again.onload_seconds == 0.0  # still resident: no switch
    assert log == ["actor+"]
    with b.hold(0, component="rollout", timeout=5) as grant:
        assert [(e.owner, e.component, e.ok) for e in grant.evictions] == [("a", "actor", True)]
    assert log == ["actor+", "actor-", "rollout+"]
    assert [(e.component, e.direction) for e in a.switch_events] == [
        ("actor", "onload"), ("actor", "offload")]
    switches = profiler.profile.switches
    assert [(s.component, s.direction) for s in switches] == [
        ("actor", "onload"), ("actor", "offload")]


def test_eviction_waits_while_the_component_runs_on_another_device(
    server: DeviceLockServer, connect: Callable[..., DeviceLockClient]
) -> None:
    log: list[str] = []
    a, b = connect("a"), connect("b")
    a.register("actor", CallbackOnloadable(lambda: log.append("on"), lambda: log.append("off")))
    a.acquire([0, 1], component="actor", timeout=5)
    a.release(0)  # actor still runs on device 1: offloading it now would pull its state
    with pytest.raises(DeviceLockTimeoutError, match="stop using 'actor'"):
        b.acquire(0, component="rollout", timeout=0.2)
    assert log == ["on"]
    a.release(1)
    b.acquire(0, component="rollout", timeout=5)
    assert log == ["on", "off"]


def test_failed_onload_releases_and_failed_offload_is_reported(
    connect: Callable[..., DeviceLockClient]
) -> None:
    a, b = connect("a"), connect("b")

    def boom() -> None:
        raise RuntimeError("out of memory")

    b.register("rollout", CallbackOnloadable(boom, lambda: None))
    with pytest.raises(RuntimeError, match="out of memory"):
        b.acquire(3, component="rollout", timeout=5)
    a.register("actor", CallbackOnloadable(lambda: None, boom))
    a.acquire(3, component="actor", timeout=5)  # not blocked: b gave device 3 back
    a.release(3)
    grant = b.acquire(3, component="plain", timeout=5)
    (eviction,) = grant.evictions
    assert not eviction.ok and "out of memory" in eviction.error


def test_refusals(server: DeviceLockServer, token: bytes,
                  connect: Callable[..., DeviceLockClient]) -> None:
    connect("dup")
    with pytest.raises(DeviceLockError, match="already connected"):
        connect("dup")
    with pytest.raises(DeviceLockError, match="cannot reach"):
        DeviceLockClient(server.address, token=new_token(), owner="intruder")
    with pytest.raises(DeviceLockError, match="distinct device indices in 0-3"):
        connect("c").acquire(4, component="actor", timeout=1)


def test_server_gone_fails_waiters(token: bytes) -> None:
    srv = DeviceLockServer(token=token)
    a = DeviceLockClient(srv.address, token=token, owner="a")
    b = DeviceLockClient(srv.address, token=token, owner="b")
    a.acquire(0, component="x", timeout=5)
    result: list[BaseException] = []
    t = threading.Thread(target=lambda: _capture(result, b.acquire, 0, component="y",
                                                 timeout=60))
    t.start()
    wait_until(lambda: waiting_on(srv, 0) == ["b"], "b to queue")
    srv.close()
    t.join(timeout=60)
    assert len(result) == 1 and isinstance(result[0], DeviceLockError)
    assert "lost" in str(result[0]) or "connection" in str(result[0])
    a.close()
    b.close()


def _capture(out: list[BaseException], fn: Callable[..., object], *args: object,
             **kw: object) -> None:
    try:
        fn(*args, **kw)
    except BaseException as exc:
        out.append(exc)


def test_invalid_timeout_is_refused(connect: Callable[..., DeviceLockClient]) -> None:
    client = connect("t")
    for bad in (float("inf"), float("nan"), -1.0):
        with pytest.raises(DeviceLockError, match="expected finite seconds"):
            client.acquire(0, component="x", timeout=bad)


def test_server_as_its_own_process(token: bytes) -> None:
    env = {**os.environ, "RLINF_COMM_TOKEN": token.hex(), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlinf.sched.device_lock", "--num-devices", "2"],
        env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        address = next(line.split()[1] for line in proc.stdout if line.startswith("listening "))
        with DeviceLockClient(address, token=token, owner="p") as client:
            assert client.acquire(1, component="x", timeout=5).devices == (1,)
            assert client.state()[0]["holder"] == "p"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def _memory_server_clients(
    token: bytes, sizes: dict[str, int | None], *, device_memory: int | None
) -> tuple[DeviceLockServer, dict[str, DeviceLockClient], list[str]]:
    server = DeviceLockServer(token=token, num_devices=1, device_memory=device_memory)
    log: list[str] = []
    clients = {}
    for name, size in sizes.items():
        client = DeviceLockClient(server.address, token=token, owner=name)
        client.register(name, CallbackOnloadable(lambda n=name: log.append(f"{n}+"),
                                                 lambda n=name: log.append(f"{n}-")),
                        memory_bytes=size)
        clients[name] = client
    return server, clients, log


def _take_turns(clients: dict[str, DeviceLockClient], order: list[str]) -> None:
    for name in order:
        with clients[name].hold(0, component=name, timeout=5):
            pass


def _close(server: DeviceLockServer, clients: dict[str, DeviceLockClient]) -> None:
    for client in clients.values():
        client.close()
    server.close()


def test_components_that_fit_together_are_never_offloaded(token: bytes) -> None:
    server, clients, log = _memory_server_clients(
        token, {"rollout": 40, "actor": 50, "reward": 0}, device_memory=100)
    try:
        _take_turns(clients, ["rollout", "reward", "actor"] * 3)
        assert log == ["rollout+", "reward+", "actor+"]  # first onloads, then nothing moves
        (state,) = server.state()
        assert sorted(tuple(r) for r in state["resident"]) == [
            ("actor", "actor"), ("reward", "reward"), ("rollout", "rollout")]
    finally:
        _close(server, clients)


def test_components_that_do_not_fit_switch_at_every_change_of_holder(token: bytes) -> None:
    server, clients, log = _memory_server_clients(
        token, {"rollout": 60, "actor": 60}, device_memory=100)
    try:
        _take_turns(clients, ["rollout", "actor", "actor", "rollout"])
        assert log == ["rollout+", "rollout-", "actor+", "actor-", "rollout+"]
    finally:
        _close(server, clients)


def test_the_lock_evicts_least_recently_used_like_the_simulator(token: bytes) -> None:
    # a and b fit together, c needs the whole device: the same rule as
    # test_simulator.test_switches_evict_least_recently_used_so_a_pair_that_fits_stays.
    server, clients, log = _memory_server_clients(
        token, {"a": 40, "b": 40, "c": 90}, device_memory=100)
    try:
        _take_turns(clients, ["a", "b", "a", "b", "c", "a"])
        # a and b offload concurrently (two processes): their order is not defined.
        assert log[:2] == ["a+", "b+"] and sorted(log[2:4]) == ["a-", "b-"]
        assert log[4:] == ["c+", "c-", "a+"]
    finally:
        _close(server, clients)


def test_unknown_sizes_keep_one_component_resident(token: bytes) -> None:
    for device_memory, size in ((None, 10), (100, None)):
        server, clients, log = _memory_server_clients(
            token, {"rollout": size, "actor": 10}, device_memory=device_memory)
        try:
            _take_turns(clients, ["rollout", "actor"])
            assert log == ["rollout+", "rollout-", "actor+"]
        finally:
            _close(server, clients)


def test_bad_memory_sizes_are_refused(token: bytes, connect: Callable[..., DeviceLockClient]
                                      ) -> None:
    with pytest.raises(DeviceLockError, match="device_memory"):
        DeviceLockServer(token=token, device_memory=-1)
    with pytest.raises(DeviceLockError, match="memory_bytes"):
        connect("a").register("actor", CallbackOnloadable(lambda: None, lambda: None),
                              memory_bytes=-5)
