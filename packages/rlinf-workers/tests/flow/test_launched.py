"""`LaunchedFlow` around a run: trainers' checkpoints, refusals once closed, one cleanup."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlinf.workers.errors import ConfigError
from rlinf.workers.flow.errors import FlowClosedError
from rlinf.workers.flow.launched import LaunchedFlow


class _Group:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def call(self, method: str, path: str, **_: Any) -> None:
        self.calls.append((method, path))


class _Run:
    """The parts of a `FlowRun` a handle uses: a trainer "actor" and a close."""

    def __init__(self) -> None:
        self.flow = SimpleNamespace(trainers=("actor",))
        self.timeout = 5.0
        self.closed = False
        self.kills: list[bool] = []
        self.actor = _Group()
        self.synced = 0

    def group_of(self, name: str) -> _Group:
        assert name == "actor"
        return self.actor

    def sync_weights(self) -> float:
        self.synced += 1
        return 0.0

    def drain_spans(self) -> list[str]:
        return ["span"]

    def close(self, *, kill: bool = False) -> None:
        self.closed = True
        self.kills.append(kill)


def test_the_trainers_save_and_load_under_their_names_then_weights_sync(tmp_path: Path) -> None:
    run = _Run()
    flow = LaunchedFlow(run)  # type: ignore[arg-type]
    flow.save(tmp_path)
    (tmp_path / "actor").mkdir()
    flow.load(tmp_path)
    assert run.actor.calls == [("save", str(tmp_path / "actor")),
                               ("load", str(tmp_path / "actor"))]
    assert run.synced == 1
    with pytest.raises(ConfigError, match=r"save one with LaunchedFlow\.save"):
        flow.load(tmp_path / "nothing")
    assert flow.drain_spans() == []  # no trace asked for
    assert LaunchedFlow(run, trace=True).drain_spans() == ["span"]  # type: ignore[arg-type]


def test_a_closed_flow_refuses_its_groups_and_cleans_up_once() -> None:
    run, cleaned = _Run(), []
    with pytest.raises(RuntimeError), \
            LaunchedFlow(run, on_close=lambda: cleaned.append(1)) as flow:  # type: ignore[arg-type]
        raise RuntimeError("a failed step")
    assert run.kills == [True] and cleaned == [1]  # killed: ranks may be stuck
    flow.close()
    assert cleaned == [1]
    with pytest.raises(FlowClosedError, match="launch a new one and load the last checkpoint"):
        flow.group("actor")
