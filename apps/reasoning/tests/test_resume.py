"""The reasoning config through the runner's resume checks (no flow needed): which keys a
resumed run may change, and what a refusal names."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlinf_reasoning.config import ReasoningConfig, from_omegaconf
from rlinf_reasoning.errors import CheckpointMismatchError, ResumeError
from rlinf_reasoning.run import ReasoningTask
from rlinf_reasoning.spec import flow_spec
from rlinf_reasoning.workflow import fixed_plan

from rlinf.workers import training
from rlinf.workers.telemetry import CheckpointStore
from rlinf.workers.training import ResumePoint, checkpoint_meta


def config(**run: object) -> ReasoningConfig:
    return from_omegaconf({"run": run, "algorithm": {"lr": 3e-4}}, num_devices=2)


def save(store: CheckpointStore, cfg: ReasoningConfig, step: int) -> Path:
    plan = fixed_plan(flow_spec(cfg), "collocated", num_devices=2)

    def write(directory: Path) -> None:
        (directory / "actor").mkdir()
        (directory / "actor" / "weights").write_text(str(step))

    return store.save(step, write, meta=checkpoint_meta(
        ReasoningTask(cfg).config(), step=step, before={"heldout/accuracy": 0.25}, plan=plan,
        seconds=12.5, counted=64, overrides=["algorithm.lr=3e-4"]))


def find_resume_point(store: CheckpointStore, cfg: ReasoningConfig) -> ResumePoint:
    task = ReasoningTask(cfg)
    return training.find_resume_point(store, task.config(), defaults=task.default_config(),
                                      may_change=task.resumable_keys)


def _check_run_dir(run_dir: Path, store: CheckpointStore, cfg: ReasoningConfig, *,
                   resume: bool) -> ResumePoint | None:
    task = ReasoningTask(cfg)
    return training.check_run_folder(run_dir, store, config=task.config(),
                                     defaults=task.default_config(),
                                     may_change=task.resumable_keys, steps=cfg.run.steps,
                                     resume=resume)


def test_latest_checkpoint_round_trips(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    cfg = config(steps=10)
    save(store, cfg, 2)
    path = save(store, cfg, 4)
    # A longer run (and another folder path) may resume it.
    ckpt = find_resume_point(store, config(steps=50, run_dir="/elsewhere"))
    assert (ckpt.step, ckpt.path, ckpt.counted) == (4, path, 64)
    assert ckpt.before == {"heldout/accuracy": 0.25} and ckpt.seconds == 12.5
    assert ckpt.plan.mode.value == "collocated"
    assert set(ckpt.plan.placement.component_names) == {"rollout", "reward", "inference", "actor"}


def test_a_different_config_is_refused_naming_the_difference(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    save(store, config(steps=10), 3)
    other = from_omegaconf({"algorithm": {"lr": 1e-3}, "run": {"seed": 4}}, num_devices=2)
    with pytest.raises(CheckpointMismatchError) as info:
        find_resume_point(store, other)
    message = str(info.value)
    assert "algorithm.lr: 0.0003 -> 0.001" in message
    assert "run.seed: 0 -> 4" in message
    assert "algorithm.lr=3e-4" in message  # the original overrides, to pass again
    assert "run.steps" in message
    assert isinstance(info.value, ResumeError)


def test_no_checkpoint_and_unreadable_meta(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    with pytest.raises(ResumeError, match="no checkpoint"):
        find_resume_point(store, config())
    store.save(1, lambda d: None, meta={"config": ReasoningTask(config()).config()})
    with pytest.raises(ResumeError, match="unreadable meta"):
        find_resume_point(store, config())


def test_run_dir_guards(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoints")
    cfg = config(steps=4)
    assert _check_run_dir(tmp_path, store, cfg, resume=False) is None
    save(store, cfg, 4)
    with pytest.raises(ResumeError, match="already holds a run"):
        _check_run_dir(tmp_path, store, cfg, resume=False)
    with pytest.raises(ResumeError, match="nothing to do"):
        _check_run_dir(tmp_path, store, cfg, resume=True)
    ckpt = _check_run_dir(tmp_path, store, config(steps=6), resume=True)
    assert ckpt is not None and ckpt.step == 4
    fresh = tmp_path / "fresh"
    (fresh).mkdir()
    (fresh / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(ResumeError, match="already holds a run"):
        _check_run_dir(fresh, CheckpointStore(fresh / "checkpoints"), cfg, resume=False)


def test_a_checkpoint_from_before_a_key_existed_resumes_while_the_key_is_at_its_default(
        tmp_path: Path) -> None:
    import json

    from rlinf.workers.telemetry.checkpoints import META_FILE

    store = CheckpointStore(tmp_path)
    path = save(store, config(steps=10), 3)
    meta = json.loads((path / META_FILE).read_text())
    del meta["config"]["reward.function"]  # as written by a version without the key
    (path / META_FILE).write_text(json.dumps(meta))
    assert find_resume_point(store, config(steps=20, export_hf=True)).step == 3
    changed = from_omegaconf({"run": {"steps": 20}, "algorithm": {"lr": 3e-4},
                              "reward": {"function": "math:copysign"}}, num_devices=2)
    with pytest.raises(CheckpointMismatchError, match=r"reward\.function: None -> "):
        find_resume_point(store, changed)
