"""The run folder's checks, without a flow: what a resume may change, what a refusal names,
and a checkpoint written before a config key existed."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from rlinf.sched import ExecutionPlan, parse_placement
from rlinf.workers.telemetry import CheckpointStore
from rlinf.workers.training import (
    CheckpointMismatchError,
    ResumeError,
    check_run_folder,
    checkpoint_meta,
    find_resume_point,
)
from rlinf.workers.training.folder import config_differences

CONFIG = {"run.steps": 4, "run.dir": "a", "model.width": 8}
MAY_CHANGE = frozenset({"run.steps", "run.dir"})


def _plan() -> ExecutionPlan:
    placement = parse_placement("a,b: 0", components=("a", "b"), num_devices=1)
    return ExecutionPlan(placement, {"a": 4, "b": 4}, {}, 0.0, 0.0, "collocated")


def _save(store: CheckpointStore, step: int, config: dict[str, object]) -> Path:
    return store.save(step, lambda d: (d / "state").write_text(str(step)), meta=checkpoint_meta(
        config, step=step, before={"score": 0.5}, plan=_plan(), seconds=1.5,
        counted=10 * step, overrides=["model.width=8"]))


def test_only_the_keys_a_resume_may_change_differ() -> None:
    assert config_differences(CONFIG, {**CONFIG, "run.steps": 9, "run.dir": "b"}, defaults={},
                              may_change=MAY_CHANGE) == ()
    assert config_differences(CONFIG, {**CONFIG, "model.width": 16}, defaults={},
                              may_change=MAY_CHANGE) == ("model.width: 8 -> 16",)
    # a key the checkpoint's version lacked resumes while it holds its default
    newer = {**CONFIG, "model.depth": 2}
    assert config_differences(CONFIG, newer, defaults={"model.depth": 2},
                              may_change=MAY_CHANGE) == ()
    assert config_differences(CONFIG, {**newer, "model.depth": 3}, defaults={"model.depth": 2},
                              may_change=MAY_CHANGE) == ("model.depth: None -> 3",)


def test_the_latest_checkpoint_resumes_and_a_changed_config_is_refused(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoints")
    _save(store, 2, CONFIG)
    path = _save(store, 4, CONFIG)
    point = find_resume_point(store, {**CONFIG, "run.steps": 8}, defaults={},
                              may_change=MAY_CHANGE)
    assert (point.step, point.path, point.before, point.counted) == (4, path, {"score": 0.5}, 40)
    with pytest.raises(CheckpointMismatchError) as info:
        find_resume_point(store, {**CONFIG, "model.width": 16}, defaults={},
                          may_change=MAY_CHANGE)
    message = str(info.value)
    assert "model.width: 8 -> 16" in message and "model.width=8" in message
    assert "except run.dir, run.steps" in message
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, ResumeError) and str(again) == message


def test_the_folder_guards(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoints")

    def check(*, steps: int, resume: bool, restarting: bool = False) -> object:
        return check_run_folder(tmp_path, store, config={**CONFIG, "run.steps": steps},
                                defaults={}, may_change=MAY_CHANGE, steps=steps, resume=resume,
                                restarting=restarting)

    with pytest.raises(ResumeError, match="no checkpoint"):
        check(steps=4, resume=True)
    assert check(steps=4, resume=False) is None
    assert check(steps=4, resume=False, restarting=True) is None  # died before a checkpoint
    _save(store, 4, CONFIG)
    with pytest.raises(ResumeError, match="already holds a run"):
        check(steps=4, resume=False)
    with pytest.raises(ResumeError, match="nothing to do"):
        check(steps=4, resume=True)
    assert check(steps=6, resume=True).step == 4  # type: ignore[attr-defined]
    store.save(5, lambda d: None, meta={"config": CONFIG})
    with pytest.raises(ResumeError, match="unreadable meta"):
        check(steps=6, resume=True)


def test_an_export_finds_the_latest_or_the_named_step_and_says_what_is_missing(
        tmp_path: Path) -> None:
    from rlinf.workers.errors import ConfigError
    from rlinf.workers.training.folder import (
        EXPORT_FILE,
        checkpoint_for_export,
        write_export_record,
    )

    with pytest.raises(ConfigError, match="holds no complete checkpoint"):
        checkpoint_for_export(tmp_path, None)
    store = CheckpointStore(tmp_path / "checkpoints")
    _save(store, 2, CONFIG)
    latest = _save(store, 4, CONFIG)
    step, folder, meta = checkpoint_for_export(tmp_path, None)
    assert (step, folder, meta["config"]) == (4, latest, CONFIG)
    assert checkpoint_for_export(tmp_path, 2)[0] == 2
    with pytest.raises(ConfigError, match=r"no checkpoint of step 3; it has steps \[2, 4\]"):
        checkpoint_for_export(tmp_path, 3)
    write_export_record(tmp_path, run_dir=Path("runs/a"), step=4, config_hash="abc")
    import json

    assert json.loads((tmp_path / EXPORT_FILE).read_text()) == {
        "run_dir": "runs/a", "step": 4, "config_hash": "abc"}
