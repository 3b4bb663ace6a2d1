"""WorkerGroup on a real local Ray: launch, dispatch, failures and timeouts."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
import pytest
import ray
import structlog
import torch

from rlinf.sched.placement import ComponentPlacement
from rlinf.sched.profiler import Profile
from rlinf.workers.errors import (
    ClusterLostError,
    DispatchError,
    GroupClosedError,
    WorkerCallError,
    WorkerDiedError,
    WorkerTimeoutError,
)
from rlinf.workers.runtime import (
    PER_RANK_ALL,
    RANK_ZERO,
    SCATTER_CONCAT,
    DispatchSpec,
    Gather,
    Worker,
    WorkerContext,
    WorkerGroup,
    ray_session,
)

# Test modules are not importable in Ray's worker processes: ship these classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CPUS = 0.25  # per rank: several small groups fit in ray.init(num_cpus=2)


class EchoWorker(Worker):
    """Reports its identity, transforms batches, fails or exits on request."""

    dispatch: ClassVar[Mapping[str, DispatchSpec]] = {"shard": SCATTER_CONCAT}

    def __init__(self, context: WorkerContext, *, offset: int = 0) -> None:
        super().__init__(context)
        self.offset = offset

    def whoami(self) -> dict[str, Any]:
        return {
            "role": self.role, "rank": self.rank, "world_size": self.world_size,
            "devices": self.devices, "pid": os.getpid(), "offset": self.offset,
            "log_context": structlog.contextvars.get_contextvars(),
        }

    def shard(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {"x": batch["x"] * 2, "rank": [self.rank] * len(batch["x"])}

    def add(self, a: Any, b: Any) -> Any:
        return a + b

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def exit_if(self, rank: int) -> int:
        if self.rank == rank:
            os._exit(1)  # a crash: no cleanup, no reply
        return self.rank

    def block(self, seconds: float) -> bool:
        threading.Event().wait(seconds)  # never set: stands for a stuck collective
        return True

    def measured(self, batch_size: int) -> Profile:
        with self.measure(batch_size=batch_size):
            sum(range(10_000))
        return self.profile()


class BrokenWorker(Worker):
    """Fails in its constructor."""

    def __init__(self, context: WorkerContext) -> None:
        super().__init__(context)
        raise RuntimeError(f"cannot start rank {context.rank}: bad config")


@pytest.fixture(scope="module")
def echo(cluster: str) -> Iterator[WorkerGroup]:
    group = WorkerGroup.launch(
        EchoWorker, placement=ComponentPlacement("echo", (2, 5)), num_cpus_per_rank=CPUS,
        init_kwargs={"offset": 3}, call_timeout=60,
    )
    yield group
    group.shutdown()


def test_launch_gives_each_rank_its_identity(echo: WorkerGroup) -> None:
    who = echo.call("whoami")
    assert [w["rank"] for w in who] == [0, 1]
    assert [w["devices"] for w in who] == [(2,), (5,)]
    assert {w["role"] for w in who} == {"echo"}
    assert {w["world_size"] for w in who} == {2}
    assert {w["offset"] for w in who} == {3}  # init_kwargs reach __init__
    # logging in the worker process is configured and tagged with role/rank
    assert [w["log_context"] for w in who] == [{"role": "echo", "rank": 0},
                                               {"role": "echo", "rank": 1}]
    assert [info.pid for info in echo.infos] == [w["pid"] for w in who]
    assert all(info.node_ip for info in echo.infos)


def test_scatter_concat_from_class_dispatch(echo: WorkerGroup) -> None:
    # 5 rows over 2 ranks: rank 0 gets 3, rank 1 gets 2 (Worker.dispatch sets SCATTER_CONCAT)
    out = echo.call("shard", {"x": torch.arange(5.0)})
    assert torch.equal(out["x"], torch.arange(5.0) * 2)
    assert out["rank"] == [0, 0, 0, 1, 1]
    arrays = echo.call("add", np.arange(4), np.ones(4, dtype=np.int64), spec=SCATTER_CONCAT)
    assert arrays.tolist() == [1, 2, 3, 4]


def test_broadcast_per_rank_and_selected_ranks(echo: WorkerGroup) -> None:
    assert echo.call("add", 1, 2) == [3, 3]
    assert echo.call("add", [10, 20], b=[1, 2], spec=PER_RANK_ALL) == [11, 22]
    assert echo.call("add", 1, 2, spec=RANK_ZERO) == 3
    only_one = echo.call("whoami", spec=DispatchSpec(gather=Gather.FIRST, ranks=(1,)))
    assert only_one["rank"] == 1
    future = echo.call_async("add", "a", "b")
    assert future.result(timeout=30) == ["ab", "ab"]
    assert future.done()
    assert future.ranks == (0, 1)


def test_worker_exception_is_typed_and_group_survives(echo: WorkerGroup) -> None:
    pattern = r"'echo' rank [01] .*'fail'.*ValueError: nope"
    with pytest.raises(WorkerCallError, match=pattern) as info:
        echo.call("fail", "nope")
    assert isinstance(info.value.cause, ValueError)
    assert echo.call("add", 0, 1) == [1, 1]


def test_bad_calls_fail_before_sending(echo: WorkerGroup) -> None:
    with pytest.raises(DispatchError, match="no public method 'nope'"):
        echo.call("nope")
    with pytest.raises(DispatchError, match="type int"):
        echo.call("add", 1, 2, spec=SCATTER_CONCAT)
    with pytest.raises(DispatchError, match="ranks"):
        echo.call("add", 1, 2, spec=DispatchSpec(ranks=(0, 7)))


def test_profiles_come_back(echo: WorkerGroup) -> None:
    profiles = echo.call("measured", 8)
    merged = profiles[0].merge(*profiles[1:])
    assert merged.components == ("echo",)
    assert [m.batch_size for m in merged.of("echo")] == [8, 8]


def test_dead_ranks_raise_worker_died(cluster: str) -> None:
    group = WorkerGroup.launch(EchoWorker, role="victim", num_ranks=2, num_cpus_per_rank=CPUS,
                               call_timeout=60)
    try:
        # rank 1 exits mid-call (os._exit): the call fails naming it, no hang
        with pytest.raises(WorkerDiedError, match="'victim' rank 1") as died:
            group.call("exit_if", 1)
        assert died.value.rank == 1
        assert died.value.node == group.infos[1].node_ip
        # rank 0 is killed from outside (SIGKILL): the next call to it fails the same way
        os.kill(group.infos[0].pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match="'victim' rank 0"):
            group.call("whoami", spec=RANK_ZERO)
    finally:
        group.kill()
    with pytest.raises(GroupClosedError):
        group.call("whoami")


def test_timeout_names_the_stuck_ranks(cluster: str) -> None:
    group = WorkerGroup.launch(EchoWorker, role="stuck", num_ranks=1, num_cpus_per_rank=CPUS)
    try:
        future = group.call_async("block", 120.0)
        assert not future.done()
        with pytest.raises(WorkerTimeoutError, match=r"'stuck' rank\(s\) \[0\].*'block'"):
            future.result(timeout=0.5)
    finally:
        group.kill()


def test_a_call_ends_soon_after_the_cluster_stops_answering(
        ray_instance: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the GCS gone, Ray never tells the driver that a rank died, and Ray aborts the
    driver a minute later: the wait itself notices (here the recorded GCS address is made to
    point at a closed port while a rank is stuck)."""
    group = WorkerGroup.launch(EchoWorker, role="orphan", num_ranks=1, num_cpus_per_rank=CPUS)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setattr(ray_session, "_last", ray_session._Connection(address=closed))
    try:
        future = group.call_async("block", 120.0)
        started = time.monotonic()
        with pytest.raises(ClusterLostError, match="gone or unreachable"):
            future.result(timeout=60)
        assert time.monotonic() - started < 10.0
    finally:
        group.kill()


def test_a_rank_on_a_lost_node_is_named_dead_before_ray_says_so(
        ray_instance: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray reports the death of a rank on a lost node only once it declares the node dead;
    the future asks about the nodes of its unfinished ranks (here rank 1's is made lost)."""
    from rlinf.workers.runtime import group as group_module

    group = WorkerGroup.launch(EchoWorker, role="far", num_ranks=2, num_cpus_per_rank=CPUS)
    try:
        future = group.call_async("block", 120.0)
        assert future.died_with_a_node() is None  # every node answers
        assert set(group._raylets) == {0, 1}  # each rank's raylet, recorded at launch
        far = group._raylets[1]
        asked: list[set[str]] = []

        def lost(addresses: Any) -> set[str]:
            asked.append(set(addresses))
            return {far}

        monkeypatch.setattr(group_module, "unreachable", lost)
        died = future.died_with_a_node()
        assert isinstance(died, WorkerDiedError)
        # one local node holds both ranks: the first unfinished one on it is named
        assert (died.role, died.rank, died.method) == ("far", 0, "block")
        assert "Ray node was lost" in str(died) and asked == [{far}]
    finally:
        group.kill()


def test_constructor_failure_fails_launch(cluster: str) -> None:
    with pytest.raises(WorkerDiedError, match="'broken' rank 0") as info:
        WorkerGroup.launch(BrokenWorker, role="broken", num_ranks=1, num_cpus_per_rank=CPUS,
                           launch_timeout=60)
    assert "RuntimeError: cannot start rank 0: bad config" in str(info.value)
    assert info.value.method == "__init__"
