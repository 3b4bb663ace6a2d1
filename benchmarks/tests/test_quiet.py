"""quiet: waiting for idle cores between benchmark runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import quiet


def _ticks(monkeypatch: pytest.MonkeyPatch, samples: list[tuple[int, int]]) -> None:
    it = iter(samples)
    monkeypatch.setattr(quiet, "_cpu_ticks", lambda: next(it))
    monkeypatch.setattr(quiet.time, "sleep", lambda _s: None)


def test_busy_fraction_is_busy_over_total_ticks_of_the_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _ticks(monkeypatch, [(1000, 5000), (1150, 5200)])
    assert quiet.busy_fraction(1.0) == pytest.approx(0.75)


def test_cpu_ticks_read_the_machine() -> None:
    busy, total = quiet._cpu_ticks()
    assert 0 <= busy <= total and total > 0


def test_wait_for_idle_cores_returns_at_the_first_quiet_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Windows 90% busy, 50% busy, then 10% busy: the third one is quiet enough.
    _ticks(monkeypatch, [(0, 0), (90, 100), (90, 100), (140, 200), (140, 200), (150, 300)])
    clock = iter([0.0, 1.0, 2.0, 3.0, 3.0])
    monkeypatch.setattr(quiet.time, "monotonic", lambda: next(clock))
    assert quiet.wait_for_idle_cores(0.15, patience=30.0) == 3.0


def test_wait_for_idle_cores_gives_up_after_its_patience(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet, "busy_fraction", lambda _w: 1.0)
    clock = iter([0.0, 10.0, 20.0, 31.0, 31.0])
    monkeypatch.setattr(quiet.time, "monotonic", lambda: next(clock))
    assert quiet.wait_for_idle_cores(0.15, patience=30.0) == 31.0
