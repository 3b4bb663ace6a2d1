from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from rlinf.envs import DatasetError, DatasetNotFoundError, DatasetRecordError
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
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        load_problems(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError):
        load_problems(tmp_path)
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


GOOD = json.dumps({"question": "1+1", "answer": "2"})


@pytest.mark.parametrize(("text", "line", "phrases"), [
    (f"{GOOD}\n\n{{oops\n", 3, ("not a JSON object", "question/answer")),
    ('{"q": "1+1", "a": "2"}\n', 1, ("cannot tell the record layout", "problem/solution")),
    (f'{GOOD}\n{{"question": "2+2"}}\n', 2, ("rlinf record needs keys question, answer",
                                             "lacks 'answer'")),
    (f"{GOOD}\n[1, 2]\n", 2, ("not a JSON object but a list",)),
    (f'{GOOD}\n{{"question": "x", "answer": "\\u00e9"}}\n\xff\n', 3, ("not UTF-8",)),
])
def test_a_bad_record_names_file_and_line(tmp_path: Path, text: str, line: int,
                                          phrases: tuple[str, ...]) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(DatasetRecordError) as info:
        load_problems(path)
    assert (info.value.path, info.value.line) == (str(path), line)
    assert str(info.value).startswith(f"{path}:{line}: ")
    for phrase in phrases:
        assert phrase in str(info.value)
    back = pickle.loads(pickle.dumps(info.value))
    assert (type(back), str(back), back.line) == (DatasetRecordError, str(info.value), line)


@pytest.mark.skipif(not has_module("pyarrow"), reason="pyarrow (extra parquet) not installed")
def test_a_bad_parquet_row_or_file_is_named(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"question": ["1+1", "2+2"], "answer": ["2", "4"]}), path)
    assert [p.answer for p in load_problems(path, limit=1)] == ["2"]
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        load_problems(broken)
