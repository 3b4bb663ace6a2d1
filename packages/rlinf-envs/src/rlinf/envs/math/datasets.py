"""Loading math problems from JSONL and Parquet files and Hugging Face `datasets` folders.

Record layouts (detected per file from the first record's keys when `style="auto"`):

- GSM8K: `question`, `answer` where the answer is a rationale ending in `#### 42`.
- MATH: `problem`, `solution` with the final answer in `\\boxed{}`; an explicit `answer`
  field, when present, wins over the boxed one.
- veRL: `prompt` (chat messages, or a string), `reward_model.ground_truth` (the final
  answer), and usually `data_source` and `extra_info`: the Parquet files veRL's data
  scripts write, read as they are.
- rlinf: `question`, `answer` (already final), optional `solution`, `metadata`, `messages` —
  what `save_jsonl` writes.
- Any other layout through `DataKeys`: where the prompt and the final answer are (dotted
  paths reach into nested records, e.g. `reward_model.ground_truth`).

Every problem keeps its record's columns (`MathProblem.columns`, as JSON values) for reward
functions that read them, all of them or the ones `DataKeys.columns` picks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlinf.envs._extras import import_extra
from rlinf.envs.errors import ConfigError, DatasetError, DatasetNotFoundError, DatasetRecordError
from rlinf.envs.math.extract import extract_boxed, extract_hash_answer
from rlinf.envs.math.problem import MathProblem

__all__ = [
    "VERL_KEYS",
    "DataKeys",
    "Style",
    "dataset_splits",
    "load_problems",
    "problem_from_record",
    "save_jsonl",
]

Style = Literal["auto", "gsm8k", "math", "rlinf", "verl", "mapped"]
_STYLES: tuple[Style, ...] = ("auto", "gsm8k", "math", "rlinf", "verl", "mapped")
_KEYS: dict[str, tuple[str, str]] = {
    "gsm8k": ("question", "answer"),
    "math": ("problem", "solution"),
    "rlinf": ("question", "answer"),
}
_LAYOUTS = ("keys question/answer (GSM8K, rlinf), problem/solution (MATH) or "
            "prompt/reward_model.ground_truth (veRL), or name yours with DataKeys "
            "(the app's data.prompt_key and data.answer_key)")
_KNOWN = frozenset({"question", "problem", "answer", "solution", "metadata", "messages"})


@dataclass(frozen=True)
class DataKeys:
    """Where a record keeps its prompt and its final answer, and which columns reward
    functions see."""

    prompt: str | None = None
    """Dotted path of the prompt: its text, or a list of chat messages (None, with `answer`
    None: the layout is detected)."""
    answer: str | None = None
    """Dotted path of the final reference answer (e.g. ``reward_model.ground_truth``)."""
    columns: tuple[str, ...] = ()
    """Columns kept for reward functions, each ``path`` or ``name:dotted.path`` (named by
    its last part, or by ``name``); empty: every top-level column."""

    def __post_init__(self) -> None:
        if (self.prompt is None) != (self.answer is None):
            raise ConfigError("DataKeys needs both prompt and answer, or neither (the layout "
                              "is then detected)")
        for key in (self.prompt or "x", self.answer or "x", *self.columns):
            name, sep, path = key.partition(":")
            if (sep and not name) or any(not part for part in (path if sep else key).split(".")):
                raise ConfigError(f"data key {key!r} must be a dotted path like 'prompt' or "
                                  "'reward_model.ground_truth' (columns may read "
                                  "'name:path')")


    @property
    def maps_layout(self) -> bool:
        """Whether the prompt and answer are named (else the layout is detected)."""
        return self.prompt is not None


VERL_KEYS = DataKeys(prompt="prompt", answer="reward_model.ground_truth")
"""veRL's Parquet layout."""


def _lookup(record: Mapping[str, Any], path: str) -> Any:
    """The value at dotted `path`; KeyError naming the first missing part."""
    value: Any = record
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(path)
        value = value[part]
    return value


def _jsonable(value: Any) -> Any:
    """`value` as plain JSON values (a Parquet date or bytes becomes its text): what channel
    messages can carry to the reward."""
    return json.loads(json.dumps(value, default=str))


def _detect_style(record: Mapping[str, Any]) -> Style:
    if "prompt" in record and isinstance(record.get("reward_model"), Mapping):
        return "verl"
    if "problem" in record and "solution" in record:
        return "math"
    if "question" in record and "answer" in record:
        answer = str(record["answer"])
        return "gsm8k" if "####" in answer else "rlinf"
    raise DatasetError(f"cannot tell the record layout: expected {_LAYOUTS}, got "
                       f"{sorted(record)}")


def _messages(value: Any, path: str) -> tuple[str, tuple[dict[str, str], ...]]:
    """``(question, messages)`` of a prompt that is text or a list of chat messages."""
    if isinstance(value, str):
        return value, ()
    if isinstance(value, Sequence) and value and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in value):
        messages = tuple({"role": m["role"], "content": m["content"]} for m in value)
        users = [m["content"] for m in messages if m["role"] == "user"]
        if not users:
            raise DatasetError(f"the chat messages at {path!r} have no user message")
        return users[-1], messages
    raise DatasetError(f"the prompt at {path!r} must be text or a list of chat messages "
                       f"({{'role': ..., 'content': ...}}), got {str(value)[:80]!r}")


def _columns(record: Mapping[str, Any], keys: DataKeys | None) -> dict[str, Any]:
    """The record's columns `keys` picks (all of them without a pick), as JSON values."""
    if keys is None or not keys.columns:
        return _jsonable(dict(record))
    picked: dict[str, Any] = {}
    for entry in keys.columns:
        name, sep, path = entry.partition(":")
        path = path if sep else name
        picked[name if sep else path.rsplit(".", 1)[-1]] = _lookup(record, path)
    return _jsonable(picked)


def _mapped(record: Mapping[str, Any], keys: DataKeys, kind: str, source: str,
            columns: DataKeys | None) -> MathProblem:
    assert keys.prompt is not None and keys.answer is not None
    question, messages = _messages(_lookup(record, keys.prompt), keys.prompt)
    answer = _lookup(record, keys.answer)
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        raise DatasetError(f"the answer at {keys.answer!r} is empty")
    metadata: dict[str, Any] = {"source": source, "style": kind}
    for key in ("data_source", "ability"):
        if isinstance(record.get(key), str):
            metadata[key] = record[key]
    return MathProblem(question, str(answer).strip(), None, metadata, messages,
                       _columns(record, columns))


def problem_from_record(
    record: Mapping[str, Any], *, style: Style = "auto", source: str = "",
    keys: DataKeys | None = None,
) -> MathProblem:
    """Convert one raw record to a `MathProblem` (see the module docstring for layouts);
    `keys` maps a layout of your own (style "mapped", which `keys` implies)."""
    if style not in _STYLES:
        raise ConfigError(f"unknown dataset style {style!r}; expected one of {_STYLES}")
    if keys is not None and keys.maps_layout:
        kind: str = "mapped"
    elif style == "mapped":
        raise ConfigError("style 'mapped' needs keys=DataKeys(prompt=..., answer=...)")
    else:
        kind = _detect_style(record) if style == "auto" else style
    try:
        if kind == "mapped":
            assert keys is not None
            return _mapped(record, keys, kind, source, keys)
        if kind == "verl":
            return _mapped(record, VERL_KEYS, kind, source, keys)
        columns = _columns(record, keys)
        extras = {k: v for k, v in _jsonable(dict(record)).items() if k not in _KNOWN}
        metadata: dict[str, Any] = {"source": source, "style": kind, **extras}
        if kind == "gsm8k":
            rationale = str(record["answer"])
            final = extract_hash_answer(rationale)
            if final is None:
                raise DatasetError(f"GSM8K answer has no '#### <answer>' line: "
                                   f"{rationale[-80:]!r}")
            solution = rationale[: rationale.rfind("####")].strip()
            return MathProblem(str(record["question"]), final.replace(",", ""), solution,
                               metadata, columns=columns)
        if kind == "math":
            solution = str(record["solution"])
            final = record.get("answer") or extract_boxed(solution)
            if final is None:
                raise DatasetError(f"MATH solution has no \\boxed{{}} answer: "
                                   f"{solution[-80:]!r}")
            return MathProblem(str(record["problem"]), str(final), solution, metadata,
                               columns=columns)
        stored = dict(record.get("metadata") or {})
        messages = (_messages(record["messages"], "messages")[1] if record.get("messages")
                    else ())
        return MathProblem(
            str(record["question"]), str(record["answer"]), record.get("solution"),
            {**metadata, **stored}, messages, columns,
        )
    except KeyError as exc:
        mapping = keys if kind == "mapped" and keys is not None else VERL_KEYS
        needed = (f"{mapping.prompt}, {mapping.answer}" if kind in {"mapped", "verl"}
                  else ", ".join(_KEYS[kind]))
        raise DatasetError(
            f"a {kind} record needs keys {needed}; it lacks {exc.args[0]!r} "
            f"(got {sorted(record)})"
        ) from exc


def _read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed value)`` of each non-blank line."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise DatasetError(f"cannot read dataset file {path}: {exc.strerror}") from exc
    with handle:
        # Bytes, decoded per line: a bad byte is then reported at its line too.
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetRecordError(str(path), number, f"not UTF-8 text ({exc.reason})"
                                         ) from exc
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetRecordError(
                    str(path), number,
                    f"not a JSON object ({exc.msg}); expected one object per line with {_LAYOUTS}",
                ) from exc


def _read_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    """``(row number, row)`` of each row."""
    parquet: Any = import_extra("pyarrow.parquet", extra="parquet", feature="Parquet datasets")
    try:
        rows = parquet.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow's ArrowIOError / ArrowInvalid
        raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from exc
    return enumerate(rows, start=1)


_DICT_FILE = "dataset_dict.json"
_STATE_FILE = "state.json"


def dataset_splits(path: str | Path) -> tuple[str, ...]:
    """The splits of a Hugging Face `datasets` folder written by ``DatasetDict.save_to_disk``
    (read from its ``dataset_dict.json``, without importing `datasets`); () for a folder of
    one `Dataset` or anything else."""
    index = Path(path) / _DICT_FILE
    try:
        splits = json.loads(index.read_text()).get("splits", [])
    except (OSError, ValueError, AttributeError):
        return ()
    return tuple(str(s) for s in splits)


def _read_dataset_folder(path: Path, split: str) -> Iterator[tuple[int, Any]]:
    """``(row number, row)`` of a `datasets` folder (``load_from_disk``): a saved `Dataset`,
    or split `split` of a saved `DatasetDict`."""
    splits = dataset_splits(path)
    if not splits and not (path / _STATE_FILE).is_file():
        raise DatasetError(f"{path} is a folder but not one `datasets` saved (no {_DICT_FILE} "
                           f"or {_STATE_FILE}); name a .jsonl or .parquet file, or a folder "
                           "written by Dataset.save_to_disk")
    if splits and split not in splits:
        raise DatasetError(f"{path} holds the splits {list(splits)}, not {split!r}")
    datasets: Any = import_extra("datasets", extra="datasets",
                                 feature="Hugging Face datasets folders")
    loaded = datasets.load_from_disk(str(path))
    table = loaded[split] if splits else loaded
    return enumerate(iter(table), start=1)


def load_problems(
    path: str | Path, *, style: Style = "auto", keys: DataKeys | None = None,
    split: str = "train", limit: int | None = None,
) -> list[MathProblem]:
    """Read problems from a `.jsonl`/`.json` (one object per line) or `.parquet` file, or a
    Hugging Face `datasets` folder (split `split` of a `DatasetDict`).

    Raises:
        DatasetNotFoundError: `path` does not exist.
        DatasetRecordError: a line (row) is not a JSON object or lacks its layout's keys; it
            names the file and the 1-based line (row).
        DatasetError: the file has an unsupported suffix or cannot be read.
        MissingExtraError: Parquet without pyarrow, a folder without `datasets`.
    """
    file = Path(path)
    suffix = file.suffix.lower()
    if file.is_dir():
        records = _read_dataset_folder(file, split)
    elif not file.is_file():
        raise DatasetNotFoundError(f"dataset file {file} does not exist")
    elif suffix in {".jsonl", ".json"}:
        records = _read_jsonl(file)
    elif suffix == ".parquet":
        records = _read_parquet(file)
    else:
        raise DatasetError(f"unsupported dataset file {file}: expected .jsonl, .json or "
                           ".parquet, or a folder written by datasets' save_to_disk")
    problems: list[MathProblem] = []
    detected: Style = "mapped" if keys is not None and keys.maps_layout else style
    for line, record in records:
        if limit is not None and len(problems) >= limit:
            break
        if not isinstance(record, Mapping):
            raise DatasetRecordError(str(file), line, f"not a JSON object but a "
                                     f"{type(record).__name__}; expected {_LAYOUTS}")
        try:
            if detected == "auto":
                # One layout per file: detect once so a stray record cannot switch parsers.
                detected = _detect_style(record)
            problems.append(problem_from_record(record, style=detected, source=file.name,
                                                keys=keys))
        except DatasetError as exc:
            raise DatasetRecordError(str(file), line, str(exc)) from exc
    return problems


def save_jsonl(problems: Iterable[MathProblem], path: str | Path) -> int:
    """Write problems in the rlinf layout, one JSON object per line; returns the count."""
    count = 0
    with Path(path).open("w", encoding="utf-8") as handle:
        for problem in problems:
            handle.write(json.dumps(problem.to_dict(), ensure_ascii=False) + "\n")
            count += 1
    return count
