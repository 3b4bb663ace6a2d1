"""`LocalDeviceLock`: the device lock between the components of one process — the server's
semantics (FIFO, re-entrant, ordered multi-device, timeouts naming the holder, the switch
rule of `rlinf.sched.residency`) without a server."""

from __future__ import annotations

import threading
import time

import pytest

from rlinf.sched import DeviceLockError, DeviceLockTimeoutError, LocalDeviceLock
from rlinf.sched.context_switch import CallbackOnloadable
from rlinf.sched.local_lock import LocalLockClient
from rlinf.sched.profiler import Profiler


def clients(sizes: dict[str, int | None], *, device_memory: int | None = None,
            log: list[str] | None = None) -> dict[str, LocalLockClient]:
    lock = LocalDeviceLock(device_memory=device_memory)
    out = {}
    for name, size in sizes.items():
        client = lock.client(name, profiler=Profiler(track_memory=False))
        if log is not None:
            client.register(name, CallbackOnloadable(lambda n=name: log.append(f"{n}+"),
                                                     lambda n=name: log.append(f"{n}-")),
                            memory_bytes=size)
        out[name] = client
    return out


def take_turns(by_name: dict[str, LocalLockClient], order: list[str]) -> None:
    for name in order:
        with by_name[name].hold(0, component=name, timeout=5):
            pass


def test_mutual_exclusion_between_threads() -> None:
    by_name = clients({"a": None, "b": None})
    inside: list[str] = []
    overlaps: list[tuple[str, str]] = []
    guard = threading.Lock()

    def work(name: str) -> None:
        for _ in range(50):
            with by_name[name].hold([0, 1], component=name, timeout=5):
                with guard:
                    if inside:
                        overlaps.append((inside[0], name))
                    inside.append(name)
                time.sleep(0.0005)
                with guard:
                    inside.remove(name)

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []


def test_reentrant_fifo_and_a_timeout_that_names_the_holder() -> None:
    lock = LocalDeviceLock()
    by_name = {name: lock.client(name) for name in ("actor", "rollout", "reward")}
    actor = by_name["actor"]
    with actor.hold(0, component="actor", timeout=5):
        with actor.hold(0, component="actor", timeout=5):  # re-entrant
            pass
        with pytest.raises(DeviceLockTimeoutError, match="held by 'actor'"):
            by_name["rollout"].acquire(0, component="rollout", timeout=0.05)
        order: list[str] = []
        waiters = []
        for name in ("rollout", "reward"):
            def wait(n: str = name) -> None:
                with by_name[n].hold(0, component=n, timeout=5):
                    order.append(n)
            waiters.append(threading.Thread(target=wait))
            waiters[-1].start()
            deadline = time.monotonic() + 5  # queue them in this order
            while len(lock.state()[0]["waiting"]) < len(waiters):
                assert time.monotonic() < deadline
                time.sleep(0.001)
    for t in waiters:
        t.join()
    assert order == ["rollout", "reward"]  # first come, first served
    # the timed-out request left nothing behind
    assert all(d["holder"] is None and d["waiting"] == [] for d in lock.state())


def test_components_that_fit_together_are_never_offloaded() -> None:
    log: list[str] = []
    by_name = clients({"rollout": 40, "actor": 50, "reward": 0}, device_memory=100, log=log)
    take_turns(by_name, ["rollout", "reward", "actor"] * 3)
    assert log == ["rollout+", "reward+", "actor+"]


def test_the_lock_evicts_least_recently_used_like_the_simulator() -> None:
    log: list[str] = []
    by_name = clients({"a": 40, "b": 40, "c": 90}, device_memory=100, log=log)
    take_turns(by_name, ["a", "b", "a", "b", "c", "a"])
    assert log == ["a+", "b+", "a-", "b-", "c+", "c-", "a+"]
    events = [(e.component, e.direction) for e in by_name["a"].switch_events]
    assert events == [("a", "onload"), ("a", "offload"), ("a", "onload")]


def test_unknown_sizes_keep_one_component_resident() -> None:
    for device_memory, size in ((None, 10), (100, None)):
        log: list[str] = []
        by_name = clients({"rollout": size, "actor": 10}, device_memory=device_memory, log=log)
        take_turns(by_name, ["rollout", "actor"])
        assert log == ["rollout+", "rollout-", "actor+"]


def test_a_component_is_not_evicted_while_it_holds_another_device() -> None:
    log: list[str] = []
    by_name = clients({"actor": None, "rollout": None}, log=log)
    actor = by_name["actor"]
    actor.acquire([0, 1], component="actor", timeout=5)
    actor.release(0)  # still computing on device 1
    with pytest.raises(DeviceLockTimeoutError, match="to leave"):
        by_name["rollout"].acquire(0, component="rollout", timeout=0.05)
    assert log == ["actor+"]
    actor.release(1)
    with by_name["rollout"].hold(0, component="rollout", timeout=5) as grant:
        assert [(e.component, e.ok) for e in grant.evictions] == [("actor", True)]
    assert log == ["actor+", "actor-", "rollout+"]


def test_a_failed_onload_gives_the_devices_back_and_a_failed_offload_is_reported() -> None:
    lock = LocalDeviceLock()
    a, b = lock.client("a"), lock.client("b")

    def boom() -> None:
        raise RuntimeError("out of memory")

    b.register("rollout", CallbackOnloadable(boom, lambda: None))
    with pytest.raises(RuntimeError, match="out of memory"):
        b.acquire(3, component="rollout", timeout=5)
    a.register("actor", CallbackOnloadable(lambda: None, boom))
    with a.hold(3, component="actor", timeout=5):  # not blocked: b gave device 3 back
        pass
    with b.hold(3, component="plain", timeout=5) as grant:
        (eviction,) = grant.evictions
    assert not eviction.ok and "out of memory" in eviction.error


def test_closed_clients_and_bad_arguments_are_refused() -> None:
    lock = LocalDeviceLock.named("test-local-lock-refusals")
    assert LocalDeviceLock.named("test-local-lock-refusals") is lock  # one per name
    client = lock.client("a")
    with pytest.raises(DeviceLockError, match="timeout"):
        client.acquire(0, component="a", timeout=float("inf"))
    with pytest.raises(DeviceLockError, match="memory_bytes"):
        client.register("a", CallbackOnloadable(lambda: None, lambda: None), memory_bytes=-1)
    client.acquire(0, component="a", timeout=5)
    client.close()  # what it held is forgotten
    assert lock.state()[0]["holder"] is None
    with pytest.raises(DeviceLockError, match="closed"):
        client.acquire(0, component="a", timeout=5)
