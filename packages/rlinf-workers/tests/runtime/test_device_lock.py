"""Collocated groups time-share a device through rlinf.sched's device lock (context switching)."""

from __future__ import annotations

import os
import sys
import time

import pytest
import ray

from rlinf.sched import ComponentPlacement, DeviceLockServer
from rlinf.workers.errors import ConfigError, WorkerCallError
from rlinf.workers.runtime import Worker, WorkerContext, WorkerGroup, count_onloads

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Component(Worker):
    """An `Onloadable` worker that records its context switches."""

    def __init__(self, context: WorkerContext) -> None:
        super().__init__(context)
        self.switches: list[str] = []

    def onload(self) -> None:
        self.switches.append("onload")

    def offload(self) -> None:
        self.switches.append("offload")

    def step(self) -> list[str]:
        with self.hold_devices(timeout=60) as grant:
            assert grant.devices == self.devices
            return list(self.switches)

    def switch_log(self) -> list[str]:
        return list(self.switches)

    def switch_profile(self) -> list[str]:
        return [record.direction for record in self.profile().switches]


def test_collocated_groups_take_turns(cluster: str) -> None:
    token = os.urandom(16)
    with DeviceLockServer(token=token, num_devices=1) as server:
        host, port = server.address
        lock = {"device_lock_address": f"{host}:{port}", "device_lock_token": token}
        rollout = WorkerGroup.launch(Component, placement=ComponentPlacement("rollout", (0,)),
                                     num_cpus_per_rank=0.25, **lock)
        actor = WorkerGroup.launch(Component, placement=ComponentPlacement("actor", (0,)),
                                   num_cpus_per_rank=0.25, **lock)
        try:
            # rollout onloads; holding again with no one in between switches nothing
            assert rollout.call("step") == [["onload"]]
            assert rollout.call("step") == [["onload"]]
            # actor takes the device: rollout is offloaded in its process first
            assert actor.call("step") == [["onload"]]
            assert rollout.call("switch_log") == [["onload", "offload"]]
            # and back again
            assert rollout.call("step") == [["onload", "offload", "onload"]]
            assert actor.call("switch_log") == [["onload", "offload"]]
            # switch times reach each worker's profiler (the planner's switch costs)
            assert rollout.call("switch_profile") == [["onload", "offload", "onload"]]
        finally:
            rollout.shutdown()
            actor.shutdown()


def test_hold_without_a_lock_server_says_how_to_fix(cluster: str) -> None:
    group = WorkerGroup.launch(Component, role="lonely", num_ranks=1, num_cpus_per_rank=0.25)
    try:
        with pytest.raises(WorkerCallError, match="device_lock_address") as info:
            group.call("step")
        assert isinstance(info.value.cause, ConfigError)
    finally:
        group.kill()


class Stateless(Worker):
    """A worker with no onload/offload: it keeps nothing on its devices."""

    def step(self) -> None:
        with self.hold_devices(timeout=60):
            pass


def test_groups_that_fit_on_the_device_stay_resident(cluster: str) -> None:
    # the plan's memory per component (40 + 50 of 100 bytes) fits: after the first onloads
    # nothing moves, and a stateless group between them evicts nobody.
    token = os.urandom(16)
    with DeviceLockServer(token=token, num_devices=1, device_memory=100) as server:
        host, port = server.address
        lock = {"device_lock_address": f"{host}:{port}", "device_lock_token": token}
        rollout = WorkerGroup.launch(Component, placement=ComponentPlacement("rollout", (0,)),
                                     num_cpus_per_rank=0.25, memory_bytes=40, **lock)
        actor = WorkerGroup.launch(Component, placement=ComponentPlacement("actor", (0,)),
                                   num_cpus_per_rank=0.25, memory_bytes=50, **lock)
        reward = WorkerGroup.launch(Stateless, placement=ComponentPlacement("reward", (0,)),
                                    num_cpus_per_rank=0.25, **lock)
        try:
            started = time.time()
            for _ in range(3):
                rollout.call("step")
                reward.call("step")
                actor.call("step")
            assert count_onloads([rollout, actor, reward], since=started, timeout=60) == 2
            assert rollout.call("switch_log") == [["onload"]]
            assert actor.call("switch_log") == [["onload"]]
            (state,) = server.state()
            assert sorted(name.split("-")[0] for name, _ in state["resident"]) == [
                "actor", "reward", "rollout"]
        finally:
            for group in (rollout, actor, reward):
                group.shutdown()


def test_groups_that_do_not_fit_switch_at_every_turn(cluster: str) -> None:
    token = os.urandom(16)
    with DeviceLockServer(token=token, num_devices=1, device_memory=100) as server:
        host, port = server.address
        lock = {"device_lock_address": f"{host}:{port}", "device_lock_token": token}
        rollout = WorkerGroup.launch(Component, placement=ComponentPlacement("rollout", (0,)),
                                     num_cpus_per_rank=0.25, memory_bytes=60, **lock)
        actor = WorkerGroup.launch(Component, placement=ComponentPlacement("actor", (0,)),
                                   num_cpus_per_rank=0.25, memory_bytes=60, **lock)
        try:
            started = time.time()
            for _ in range(2):
                rollout.call("step")
                actor.call("step")
            assert count_onloads([rollout, actor], since=started, timeout=60) == 4
            assert count_onloads([rollout, actor], since=time.time(), timeout=60) == 0
            assert rollout.call("switch_log") == [["onload", "offload", "onload", "offload"]]
            assert actor.call("switch_log") == [["onload", "offload", "onload"]]
        finally:
            rollout.shutdown()
            actor.shutdown()


def test_a_negative_memory_size_is_refused() -> None:
    with pytest.raises(ConfigError, match="memory_bytes"):
        WorkerContext(role="actor", rank=0, world_size=1, memory_bytes=-1)
