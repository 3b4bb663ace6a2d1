from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from rlinf.envs import ConfigError, DatasetError, DatasetNotFoundError, DatasetRecordError
from rlinf.envs._extras import has_module
from rlinf.envs.math import (
    DataKeys,
    GeneratorConfig,
    MathProblem,
    ProblemGenerator,
    dataset_splits,
    format_chat,
    format_prompt,
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
    with pytest.raises(DatasetError, match="not one `datasets` saved"):
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


VERL_ROWS = [
    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "Natalia sold 48 clips. Let's think step by step "
                                            "and output the final answer after \"####\"."}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0}},
    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weng earns $12 an hour."}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": "10"},
     "extra_info": {"split": "train", "index": 1}},
]


def test_verl_parquet_is_read_as_it_is(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(VERL_ROWS), path)
    first, second = load_problems(path)
    assert (first.answer, second.answer) == ("72", "10")
    assert first.question.startswith("Natalia") and second.question == "Weng earns $12 an hour."
    assert [m["role"] for m in second.messages] == ["system", "user"]
    assert second.prompt == VERL_ROWS[1]["prompt"]
    assert first.metadata["style"] == "verl" and first.metadata["data_source"] == "openai/gsm8k"
    assert first.columns["extra_info"] == {"split": "train", "index": 0}
    assert first.dataset_columns["reward_model"]["ground_truth"] == "72"


def test_keys_map_a_layout_of_ones_own(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"query": "7*6", "meta": {"gold": 42, "level": 3},
                                "tag": "x"}) + "\n")
    keys = DataKeys(prompt="query", answer="meta.gold", columns=("tag", "lvl:meta.level"))
    (problem,) = load_problems(path, keys=keys)
    assert (problem.question, problem.answer, problem.messages) == ("7*6", "42", ())
    assert problem.columns == {"tag": "x", "lvl": 3}
    everything = load_problems(path, keys=DataKeys(prompt="query", answer="meta.gold"))[0]
    assert everything.columns == {"query": "7*6", "meta": {"gold": 42, "level": 3}, "tag": "x"}
    with pytest.raises(DatasetRecordError, match=r"mine.jsonl:1: .*meta.missing"):
        load_problems(path, keys=DataKeys(prompt="query", answer="meta.missing"))
    with pytest.raises(ConfigError, match="dotted path"):
        DataKeys(prompt="query", answer="meta..gold")


def test_a_prompt_that_is_neither_text_nor_messages_is_named(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"prompt": [{"text": "hi"}], "reward_model":
                                {"ground_truth": "1"}}) + "\n")
    with pytest.raises(DatasetRecordError, match="text or a list of chat messages"):
        load_problems(path)


def test_datasets_folders_are_read_with_their_splits(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(3)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    assert [p.answer for p in load_problems(tmp_path / "one")] == ["1", "2", "3"]
    assert dataset_splits(tmp_path / "one") == ()
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "test": datasets.Dataset.from_list(VERL_ROWS)}).save_to_disk(
        str(tmp_path / "both"))
    assert set(dataset_splits(tmp_path / "both")) == {"train", "test"}
    assert len(load_problems(tmp_path / "both")) == 3
    assert [p.answer for p in load_problems(tmp_path / "both", split="test")] == ["72", "10"]
    with pytest.raises(DatasetError, match="not 'validation'"):
        load_problems(tmp_path / "both", split="validation")


def test_chat_messages_render_as_they_are() -> None:
    problem = problem_from_record(VERL_ROWS[1])
    assert format_chat(problem, system_prompt="ignored") == VERL_ROWS[1]["prompt"]
    assert format_prompt(problem, template="chat") == (
        "System: Be brief.\nUser: Weng earns $12 an hour.\nAssistant:")
    assert format_prompt(problem, template="short") == "Weng earns $12 an hour.="
    assert MathProblem.from_dict(problem.to_dict()).messages == problem.messages
