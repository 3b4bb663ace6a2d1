"""`with_restarts`: a session rerun after each worker death, at most `max_restarts` times,
resumed from the last checkpoint; a constructor failure is not retried."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from rlinf.workers.errors import WorkerDiedError
from rlinf.workers.flow.restarts import with_restarts
from rlinf.workers.telemetry import CheckpointStore


def _store(tmp_path: Path, step: int | None = None) -> CheckpointStore:
    store = CheckpointStore(tmp_path / "checkpoints")
    if step is not None:
        store.save(step, lambda path: (path / "state").write_text("x"), meta={"step": step})
    return store


def test_a_session_is_rerun_resumed_after_each_death_and_told_the_restarts(
        tmp_path: Path) -> None:
    calls: list[tuple[bool, tuple[str, ...]]] = []

    def session(resume: bool, restarts: tuple[str, ...]) -> str:
        calls.append((resume, restarts))
        if len(calls) <= 2:  # the second death: a process the actor shares with the env
            raise WorkerDiedError("actor", len(calls) - 1, method="run_entry",
                                  shared_with=("env",) if len(calls) == 2 else ())
        return "done"

    out = io.StringIO()
    result = with_restarts(session, resume=False, max_restarts=2, out=out,
                           checkpoints=_store(tmp_path, step=4))
    assert result == "done"
    assert [resume for resume, _ in calls] == [False, True, True]
    assert calls[-1][1] == ("actor rank 0 died; went on from step 4",
                            "actor+env rank 1 died; went on from step 4")
    assert "restart 2 of 2 from step 4" in out.getvalue()


def test_deaths_beyond_the_budget_propagate(tmp_path: Path) -> None:
    def session(resume: bool, restarts: tuple[str, ...]) -> None:
        raise WorkerDiedError("env", 0, method="run_entry")

    with pytest.raises(WorkerDiedError, match="'env' rank 0"):
        with_restarts(session, resume=False, max_restarts=1, out=io.StringIO(),
                      checkpoints=_store(tmp_path))


def test_a_constructor_failure_is_not_retried(tmp_path: Path) -> None:
    calls = []

    def session(resume: bool, restarts: tuple[str, ...]) -> None:
        calls.append(resume)
        raise WorkerDiedError("rollout", 0, method="__init__",
                              detail="its constructor raised FileNotFoundError: model.bin")

    with pytest.raises(WorkerDiedError, match="constructor raised"):
        with_restarts(session, resume=False, max_restarts=3, out=io.StringIO(),
                      checkpoints=_store(tmp_path))
    assert calls == [False]
