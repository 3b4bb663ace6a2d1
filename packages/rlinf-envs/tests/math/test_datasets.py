from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlinf.envs import DatasetError
from rlinf.envs._extras import has_module
from rlinf.envs.math import (
    GeneratorConfig,
    MathProblem,
    ProblemGenerator,
    load_problems,
    problem_from_record,
    save_jsonl,
)


def test_gsm8k_jsonl(data_dir: Path) -> None:
    problems = load_problems(data_dir / "gsm8k_sample.jsonl")
    assert [p.answer for p in problems] == ["72", "10", "2000"]
    assert problems[0].question.startswith("Natalia")
    assert problems[0].solution is not None and "####" not in problems[0].solution
    assert problems[0].metadata["style"] == "gsm8k"
    assert load_problems(data_dir / "gsm8k_sample.jsonl", limit=2)[-1].answer == "10"


@pytest.mark.skipif(not has_module("pyarrow"), reason="pyarrow (extra parquet) not installed")
def test_math_parquet_matches_jsonl(data_dir: Path) -> None:
    from_parquet = load_problems(data_dir / "math_sample.parquet")
    from_jsonl = load_problems(data_dir / "math_sample.jsonl")
    assert [p.answer for p in from_parquet] == ["\\frac{3}{4}", "4", "\\{-2, 2\\}"]
    assert [p.answer for p in from_parquet] == [p.answer for p in from_jsonl]
    assert from_parquet[0].metadata["level"] == "Level 1"
    assert from_parquet[0].metadata["style"] == "math"


def test_roundtrip_generated(tmp_path: Path) -> None:
    problems = ProblemGenerator(GeneratorConfig(seed=3)).generate(20)
    path = tmp_path / "gen.jsonl"
    assert save_jsonl(problems, path) == 20
    loaded = load_problems(path)
    assert [(p.question, p.answer) for p in loaded] == [(p.question, p.answer) for p in problems]
    assert loaded[0].metadata["compact"] == problems[0].metadata["compact"]
    assert loaded[0].metadata["source"] == "gen.jsonl"


def test_explicit_answer_field_wins_for_math_style() -> None:
    record = {"problem": "p", "solution": "\\boxed{1}", "answer": "2"}
    assert problem_from_record(record).answer == "2"


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"text": "x"}, "cannot tell the record layout"),
        ({"problem": "p", "solution": "no box"}, "no \\\\boxed"),
        ({"question": "q", "answer": "work #### "}, "has no '####"),
    ],
)
def test_bad_records(record: dict[str, str], message: str) -> None:
    with pytest.raises(DatasetError, match=message):
        problem_from_record(record)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_problems(tmp_path / "missing.jsonl")
    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n")
    with pytest.raises(DatasetError, match="unsupported"):
        load_problems(csv)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"question": "q", "answer": "1"}) + "\n{oops\n")
    with pytest.raises(DatasetError, match=r"broken.jsonl:2"):
        load_problems(broken)


def test_problem_dict_roundtrip() -> None:
    problem = MathProblem("q", "1", "s", {"k": 1})
    assert MathProblem.from_dict(problem.to_dict()) == problem
