"""`problem_source`: batches are a pure function of (seed, position); held-out is disjoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlinf_reasoning.config import ReasoningConfig, from_omegaconf
from rlinf_reasoning.data import problem_source
from rlinf_reasoning.errors import InvalidConfigError

from rlinf.envs.math import MathProblem, save_jsonl


def cfg(**data: object) -> ReasoningConfig:
    return from_omegaconf({"data": {"prompts_per_step": 8, "heldout_size": 50, **data}},
                          num_devices=2)


def test_generated_batches_are_pure_functions_of_seed_and_position() -> None:
    a, b = problem_source(cfg()), problem_source(cfg())
    forward = [a.batch(k) for k in range(5)]
    assert b.batch(3) == forward[3]          # random access
    assert b.batch(1) == forward[1]          # going back restarts the stream
    assert b.batch(4) == forward[4]
    assert len({p.question for batch in forward for p in batch}) > 20
    assert problem_source(cfg(seed=1)).batch(0) != forward[0]


def test_generated_heldout_is_distinct_and_disjoint_from_training() -> None:
    source = problem_source(cfg())
    held = {p.question for p in source.heldout}
    assert len(held) == 50
    train = {p.question for k in range(40) for p in source.batch(k)}
    assert not held & train


def test_file_dataset_split_and_epochs(tmp_path: Path) -> None:
    problems = [MathProblem(f"What is {i} + 1?", str(i + 1)) for i in range(200)]
    path = tmp_path / "p.jsonl"
    save_jsonl(problems, path)
    source = problem_source(cfg(path=str(path)))
    held = {p.question for p in source.heldout}
    assert 5 <= len(held) <= 50
    epoch = [p.question for k in range(40) for p in source.batch(k)]
    n_train = 200 - len(held)
    assert set(epoch[:n_train]) == {p.question for p in problems} - held
    assert problem_source(cfg(path=str(path))).batch(7) == source.batch(7)


def test_file_with_separate_heldout(tmp_path: Path) -> None:
    save_jsonl([MathProblem("What is 1 + 1?", "2")], tmp_path / "train.jsonl")
    save_jsonl([MathProblem("What is 2 + 2?", "4")], tmp_path / "held.jsonl")
    source = problem_source(cfg(path=str(tmp_path / "train.jsonl"),
                               heldout_path=str(tmp_path / "held.jsonl")))
    assert [p.answer for p in source.heldout] == ["4"]
    assert [p.answer for p in source.batch(3)] == ["2"] * 8


def test_empty_file_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text("")
    with pytest.raises(InvalidConfigError, match="at least one training problem"):
        problem_source(cfg(path=str(tmp_path / "t.jsonl")))
