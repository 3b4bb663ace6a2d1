"""`WorkerGroup.launch_shared`: several workers in one process per rank, each addressed as a
group of its own (`rlinf.workers.runtime.shared`)."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, ClassVar

import pytest
import ray

from rlinf.sched.placement import ComponentPlacement
from rlinf.workers.errors import WorkerCallError, WorkerDiedError
from rlinf.workers.runtime import Worker, WorkerContext, WorkerGroup, refs
from rlinf.workers.runtime.local import LocalActorDied
from rlinf.workers.runtime.shared import SharedMember

from ..leaks import eventually, live_ranks

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CPUS = 0.25


class Member(Worker):
    """Reports where it runs; can wait for a peer's event in the same process."""

    events: ClassVar[dict[str, threading.Event]] = {}  # per process: members meet here

    def __init__(self, context: WorkerContext, *, tag: str = "", fail: bool = False) -> None:
        super().__init__(context)
        if fail:
            raise RuntimeError(f"{context.role} will not start")
        self.tag = tag
        self.calls_in_flight = 0
        self.most_in_flight = 0
        self.closed = False

    def whoami(self) -> dict[str, Any]:
        return {"role": self.role, "rank": self.rank, "world": self.world_size,
                "devices": self.devices, "pid": os.getpid(), "tag": self.tag}

    def slow(self, seconds: float) -> int:
        self.calls_in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.calls_in_flight)
        time.sleep(seconds)
        self.calls_in_flight -= 1
        return self.most_in_flight

    def wait_for(self, name: str, timeout: float) -> bool:
        return Member.events.setdefault(name, threading.Event()).wait(timeout)

    def signal(self, name: str) -> None:
        Member.events.setdefault(name, threading.Event()).set()

    def exit_now(self) -> None:
        os._exit(1)

    def shutdown(self) -> None:
        self.closed = True
        super().shutdown()


def launch(*members: SharedMember, devices: tuple[int, ...] = (0, 1)) -> dict[str, WorkerGroup]:
    return WorkerGroup.launch_shared(
        members, placement=ComponentPlacement("shared", devices), num_cpus_per_rank=CPUS,
        log_level="WARNING", launch_timeout=60, call_timeout=60)


def test_members_share_one_process_per_rank_and_see_their_own_identity(
        cluster: str) -> None:
    groups = launch(SharedMember(Member, "rollout", {"tag": "r"}),
                    SharedMember(Member, "actor", {"tag": "a"}))
    try:
        rollout, actor = groups["rollout"].call("whoami"), groups["actor"].call("whoami")
        assert [w["role"] for w in rollout] == ["rollout"] * 2
        assert [w["tag"] for w in actor] == ["a", "a"]
        assert [(w["rank"], w["world"], w["devices"]) for w in actor] == [(0, 2, (0,)),
                                                                           (1, 2, (1,))]
        # rank r of every member runs in process r; two ranks, two processes
        assert [w["pid"] for w in rollout] == [w["pid"] for w in actor]
        assert len({w["pid"] for w in actor}) == 2
        assert groups["actor"].shares_processes
    finally:
        for group in groups.values():
            group.kill()


def test_members_run_side_by_side_but_each_member_one_call_at_a_time(
        cluster: str) -> None:
    groups = launch(SharedMember(Member, "consumer"), SharedMember(Member, "producer"),
                    devices=(0,))
    try:
        # The consumer waits for an event only the producer sets: with one thread per process
        # this would never end.
        waiting = groups["consumer"].call_async("wait_for", "ready", 30.0)
        groups["producer"].call("signal", "ready")
        assert waiting.result(timeout=30) == [True]
        # Two calls of one member never overlap (as in a process of its own).
        calls = [groups["consumer"].call_async("slow", 0.2) for _ in range(3)]
        assert max(c.result(timeout=30)[0] for c in calls) == 1
    finally:
        for group in groups.values():
            group.kill()


def test_a_member_that_fails_to_start_is_named_and_nothing_is_left(cluster: str) -> None:
    with pytest.raises(WorkerDiedError, match="will not start") as caught:
        launch(SharedMember(Member, "ok"), SharedMember(Member, "broken", {"fail": True}))
    assert caught.value.role == "broken" and caught.value.method == "__init__"
    assert eventually(lambda: not [n for n in live_ranks()
                                   if cluster == "local" or n.startswith("ok+broken")])


def test_a_dead_process_fails_every_members_calls_naming_the_others(cluster: str) -> None:
    groups = launch(SharedMember(Member, "env"), SharedMember(Member, "policy"), devices=(0,))
    try:
        with pytest.raises(WorkerDiedError, match=r"shared with \['env'\]"):
            groups["policy"].call("exit_now")
        with pytest.raises(WorkerDiedError, match=r"shared with \['policy'\]"):
            groups["env"].call("whoami")
    finally:
        for group in groups.values():
            group.kill()


def test_a_member_method_that_raises_is_a_call_error_of_that_member(cluster: str) -> None:
    groups = launch(SharedMember(Member, "reward"), SharedMember(Member, "actor"), devices=(0,))
    try:
        with pytest.raises(WorkerCallError) as caught:
            groups["reward"].call("wait_for", "x", "not a number")
        assert caught.value.role == "reward"
        assert groups["actor"].call("whoami")[0]["role"] == "actor"  # the process lives on
    finally:
        for group in groups.values():
            group.kill()


def test_the_processes_go_with_the_last_members_shutdown(cluster: str) -> None:
    groups = launch(SharedMember(Member, "a"), SharedMember(Member, "b"), devices=(0,))
    actor = groups["a"].actors[0]
    groups["a"].shutdown(timeout=30)
    assert groups["b"].call("whoami")[0]["role"] == "b"  # still served
    groups["b"].shutdown(timeout=30)
    # Ray kills asynchronously: a call sent just after the kill may still be served.
    deadline = time.monotonic() + 30
    with pytest.raises((ray.exceptions.RayActorError, LocalActorDied)):
        while time.monotonic() < deadline:
            refs.get(actor.worker_info.remote(), timeout=30)
