"""Channel soak: producers and consumers killed (SIGKILL) and restarted at random for
``RLINF_SOAK_SECONDS`` (default 600; CI's ``test-comm-soak-sched-envs-workers`` runs it
beside other packages' tests, ``scripts/soak_beside.py``), through the public API.

What must hold at the end (see `soak_workers.py` for what each process records):
- nothing acknowledged is lost: every item of a burst whose producer's flush returned was
  counted by a consumer, except at most one per consumer kill (the item a consumer had
  taken and not counted yet when it was killed: its owner releases it to its producer);
- no item is counted twice, and no payload is corrupt;
- the channel's owner served throughout, and no shared-memory segment is left behind (one
  that no live process maps or holds open; segments of other programs using rlinf.comm on
  the machine at the same time are theirs).

Run alone: ``RLINF_SOAK_SECONDS=60 pytest packages/rlinf-comm/tests -m soak``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlinf.comm import Channel, CommTimeoutError, Endpoint, TCPStore, new_token, token_env_value

pytestmark = [pytest.mark.soak, pytest.mark.timeout(0)]

WORKERS = Path(__file__).with_name("soak_workers.py")
SECONDS = float(os.environ.get("RLINF_SOAK_SECONDS", "600"))
SEED = int(os.environ.get("RLINF_SOAK_SEED", str(int(time.time()))))
PRODUCERS, CONSUMERS = 2, 2
KILL_EVERY_S = (1.0, 5.0)
"""A kill and restart every 1-5 s (uniform): about 200 in 10 minutes. Each restart is a new
interpreter importing numpy and rlinf.comm (~0.8 CPU-s on the 2-core CI machine); CI runs
the soak beside other suites, and every 0.5-3 s (the first setting) those imports alone
kept a third of a core busy."""


def _segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("rlinf-*")}


def _held_by_a_live_process(name: str) -> bool:
    """Whether a live process maps /dev/shm/`name` or holds it open. Once the fleet and the
    owner are gone, that is another program using rlinf.comm on this machine (a test suite
    running beside the soak), not a segment the soak left behind."""
    path = f"/dev/shm/{name}"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or proc.name == str(os.getpid()):
            continue
        try:
            if path in (proc / "maps").read_text():
                return True
            if any(os.readlink(fd) == path for fd in (proc / "fd").iterdir()):
                return True
        except OSError:  # the process exited, or is not ours to read
            continue
    return False


def _leaked(before: set[str]) -> set[str]:
    """Segments created since `before` that no live process holds."""
    return {name for name in _segments() - before if not _held_by_a_live_process(name)}


LOOKUP_S = 0.2
"""How long a final check waits for a key: long enough that a busy store's answer to a key
that exists is never taken for its absence (a call with timeout 0 waits only 40 ms)."""


def _count(store: TCPStore, key: str) -> int:
    try:
        return int(store.get(key, timeout=LOOKUP_S))
    except CommTimeoutError:
        return 0


class _Fleet:
    """The producer and consumer processes, by (role, slot), and how often each was killed."""

    def __init__(self, address: str, token: bytes) -> None:
        self.address = address
        self.env = {**os.environ, "RLINF_COMM_TOKEN": token_env_value(token)}
        self.procs: dict[tuple[str, int], subprocess.Popen[bytes]] = {}
        self.generation: dict[tuple[str, int], int] = {}
        self.kills = {"producer": 0, "consumer": 0}

    def start(self, role: str, slot: int) -> None:
        gen = self.generation.get((role, slot), -1) + 1
        self.generation[(role, slot)] = gen
        self.procs[(role, slot)] = subprocess.Popen(
            [sys.executable, str(WORKERS), role, self.address, str(slot), str(gen)],
            env=self.env)

    def kill_and_restart(self, rng: random.Random) -> None:
        role, slot = rng.choice(sorted(self.procs))
        proc = self.procs[(role, slot)]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            self.kills[role] += 1
        else:  # it exited by itself: that is a failure unless we are stopping
            raise AssertionError(f"{role} {slot} exited on its own with {proc.returncode}")
        self.start(role, slot)

    def stop_all(self, timeout: float) -> dict[str, int]:
        codes = {}
        for (role, slot), proc in self.procs.items():
            try:
                codes[f"{role}-{slot}"] = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
                codes[f"{role}-{slot}"] = -999
        return codes

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


@pytest.fixture
def fleet_store() -> Iterator[tuple[TCPStore, bytes]]:
    token = new_token()
    with TCPStore.serve(token=token, timeout=60) as store:
        yield store, token


def test_random_kills_lose_nothing_acknowledged_and_leave_no_segment(
    fleet_store: tuple[TCPStore, bytes],
) -> None:
    store, token = fleet_store
    rng = random.Random(SEED)
    before = _segments()
    fleet = _Fleet(store.address, token)
    with Endpoint("soak-owner", store=store, token=token) as me, \
            Channel.create("soak", store=store, maxsize=8, endpoint=me) as channel:
        try:
            for slot in range(PRODUCERS):
                fleet.start("producer", slot)
            for slot in range(CONSUMERS):
                fleet.start("consumer", slot)
            deadline = time.monotonic() + SECONDS
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(*KILL_EVERY_S))
                fleet.kill_and_restart(rng)
            store.set("stop", b"1")
            codes = fleet.stop_all(timeout=120)
        finally:
            fleet.kill_all()
        assert set(codes.values()) == {0}, f"seed {SEED}: exit codes {codes}"
        assert channel.qsize(timeout=10) == 0

    acked = lost = 0
    missing: list[str] = []
    for (role, slot), last_gen in fleet.generation.items():
        if role != "producer":
            continue
        for gen in range(last_gen + 1):
            tag = f"{slot}.{gen}"
            last = _count(store, f"acked/{tag}") if _has(store, f"acked/{tag}") else -1
            acked += last + 1
            gone = [f"{tag}/{s}" for s in range(last + 1) if not _has(store, f"seen/{tag}/{s}")]
            missing += gone
            lost += len(gone)
    report = (f"seed {SEED}, {SECONDS:g} s: {acked} items acknowledged, kills {fleet.kills}, "
              f"{_count(store, 'loss_reports')} loss reports, {lost} missing: {missing[:10]}")
    print(report)
    assert acked > 0, report
    assert _count(store, "duplicates") == 0, report
    assert _count(store, "corrupt") == 0, report
    assert lost <= fleet.kills["consumer"], report
    _wait_for(lambda: not _leaked(before), what=lambda: f"segments left: {_leaked(before)}")


def _has(store: TCPStore, key: str) -> bool:
    try:
        store.get(key, timeout=LOOKUP_S)
    except CommTimeoutError:
        return False
    return True


def _wait_for(predicate, *, what, timeout: float = 60.0) -> None:
    """Poll `predicate` until true; fail with `what()` (read at the end) after `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what()
        time.sleep(0.1)
