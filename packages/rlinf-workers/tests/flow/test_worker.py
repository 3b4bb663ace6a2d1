"""`FlowWorker` built in this process: its CPU threads hold in every turn, on whatever
thread calls it, and the launch's trace switch reaches its recorder."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import FlowWorker
from rlinf.workers.runtime import WorkerContext
from rlinf.workers.runtime.threads import set_cpu_threads


def context(*, trace: bool = False) -> WorkerContext:
    return WorkerContext(role="worker", rank=0, world_size=1, devices=(0,), trace=trace)


@pytest.fixture
def restored_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    set_cpu_threads(before)


def test_a_worker_computes_on_its_threads_in_every_turn_on_any_calling_thread(
        restored_threads: None) -> None:
    worker = FlowWorker(context(), num_threads=1)
    assert torch.get_num_threads() == 1
    seen: list[int] = []

    def call() -> None:  # as Ray runs a call: on a pool thread with a count of its own
        torch.set_num_threads(2)
        with worker.turn("work"):
            seen.append(torch.get_num_threads())

    caller = threading.Thread(target=call)
    caller.start()
    caller.join()
    assert seen == [1]


def test_without_num_threads_a_worker_leaves_the_processs_threads(
        restored_threads: None) -> None:
    torch.set_num_threads(2)
    worker = FlowWorker(context())
    with worker.turn("work"):
        assert torch.get_num_threads() == 2


def test_num_threads_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="num_threads must be >= 1"):
        FlowWorker(context(), num_threads=0)


def test_the_launchs_trace_switch_reaches_the_recorder() -> None:
    assert FlowWorker(context(trace=True)).trace.enabled
    assert not FlowWorker(context()).trace.enabled
    assert FlowWorker(context(), trace=True).trace.enabled  # built directly, asked here
