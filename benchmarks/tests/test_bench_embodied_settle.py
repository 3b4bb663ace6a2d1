"""bench_embodied waits for the machine to settle before profiling the next width."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_embodied


def test_settle_returns_once_the_load_is_low(monkeypatch: pytest.MonkeyPatch) -> None:
    loads = iter([2.4, 1.9, 1.1, 1.0])
    sleeps: list[float] = []
    monkeypatch.setattr(bench_embodied.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(bench_embodied.time, "sleep", sleeps.append)
    assert bench_embodied.settle(1.2, 600.0) == 1.0
    assert sleeps == [5, 5]


def test_settle_gives_up_after_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 0.0, 100.0, 200.0])
    monkeypatch.setattr(bench_embodied.os, "getloadavg", lambda: (3.0, 0.0, 0.0))
    monkeypatch.setattr(bench_embodied.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(bench_embodied.time, "sleep", lambda _s: None)
    assert bench_embodied.settle(1.2, 150.0) == 3.0
