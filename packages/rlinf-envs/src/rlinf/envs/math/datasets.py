"""Loading math problems from JSONL and Parquet files in GSM8K or MATH layout.

Record layouts (detected per file from the first record's keys when `style="auto"`):

- GSM8K: `question`, `answer` where the answer is a rationale ending in `#### 42`.
- MATH: `problem`, `solution` with the final answer in `\\boxed{}`; an explicit `answer`
  field, when present, wins over the boxed one.
- rlinf: `question`, `answer` (already final), optional `solution`, `metadata` — what
  `save_jsonl` writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from rlinf.envs._extras import import_extra
from rlinf.envs.errors import ConfigError, DatasetError, DatasetNotFoundError, DatasetRecordError
from rlinf.envs.math.extract import extract_boxed, extract_hash_answer
from rlinf.envs.math.problem import MathProblem

Style = Literal["auto", "gsm8k", "math", "rlinf"]
_STYLES: tuple[Style, ...] = ("auto", "gsm8k", "math", "rlinf")
_KEYS: dict[str, tuple[str, str]] = {
    "gsm8k": ("question", "answer"),
    "math": ("problem", "solution"),
    "rlinf": ("question", "answer"),
}
_LAYOUTS = "keys question/answer (GSM8K, rlinf) or problem/solution (MATH)"


def _detect_style(record: Mapping[str, Any]) -> Style:
    if "problem" in record and "solution" in record:
        return "math"
    if "question" in record and "answer" in record:
        answer = str(record["answer"])
        return "gsm8k" if "####" in answer else "rlinf"
    raise DatasetError(f"cannot tell the record layout: expected {_LAYOUTS}, got {sorted(record)}")


def problem_from_record(
    record: Mapping[str, Any], *, style: Style = "auto", source: str = ""
) -> MathProblem:
    """Convert one raw record to a `MathProblem` (see the module docstring for layouts)."""
    if style not in _STYLES:
        raise ConfigError(f"unknown dataset style {style!r}; expected one of {_STYLES}")
    kind = _detect_style(record) if style == "auto" else style
    extras = {k: v for k, v in record.items() if k not in {"question", "problem", "answer",
                                                           "solution", "metadata"}}
    metadata: dict[str, Any] = {"source": source, "style": kind, **extras}
    try:
        if kind == "gsm8k":
            rationale = str(record["answer"])
            final = extract_hash_answer(rationale)
            if final is None:
                raise DatasetError(f"GSM8K answer has no '#### <answer>' line: {rationale[-80:]!r}")
            solution = rationale[: rationale.rfind("####")].strip()
            return MathProblem(str(record["question"]), final.replace(",", ""), solution, metadata)
        if kind == "math":
            solution = str(record["solution"])
            final = record.get("answer") or extract_boxed(solution)
            if final is None:
                raise DatasetError(f"MATH solution has no \\boxed{{}} answer: {solution[-80:]!r}")
            return MathProblem(str(record["problem"]), str(final), solution, metadata)
        stored = dict(record.get("metadata") or {})
        return MathProblem(
            str(record["question"]), str(record["answer"]), record.get("solution"),
            {**metadata, **stored},
        )
    except KeyError as exc:
        raise DatasetError(
            f"a {kind} record needs keys {', '.join(_KEYS[kind])}; it lacks {exc.args[0]!r} "
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


def load_problems(
    path: str | Path, *, style: Style = "auto", limit: int | None = None
) -> list[MathProblem]:
    """Read problems from a `.jsonl`/`.json` (one object per line) or `.parquet` file.

    Raises:
        DatasetNotFoundError: `path` is not a file.
        DatasetRecordError: a line (row) is not a JSON object or lacks its layout's keys; it
            names the file and the 1-based line (row).
        DatasetError: the file has an unsupported suffix or cannot be read.
    """
    file = Path(path)
    if not file.is_file():
        raise DatasetNotFoundError(f"dataset file {file} does not exist")
    suffix = file.suffix.lower()
    if suffix in {".jsonl", ".json"}:
        records = _read_jsonl(file)
    elif suffix == ".parquet":
        records = _read_parquet(file)
    else:
        raise DatasetError(f"unsupported dataset file {file}: expected .jsonl, .json or .parquet")
    problems: list[MathProblem] = []
    detected: Style = style
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
            problems.append(problem_from_record(record, style=detected, source=file.name))
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
