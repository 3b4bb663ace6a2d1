"""Final-answer extraction from model responses and reference solutions.

Each extractor returns the raw answer text or None; normalization and comparison live in
`rlinf.envs.math.verify`. `extract_answer` tries them in the order a grader should trust
them: an explicit `\\boxed{}`, a GSM8K `####` marker, an "answer is" phrase, and last the
final number on the response's last non-empty line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from rlinf.envs.errors import ConfigError

Strategy = Literal["boxed", "hash", "phrase", "last_number"]
ALL_STRATEGIES: tuple[Strategy, ...] = ("boxed", "hash", "phrase", "last_number")

_BOXED_COMMANDS = ("\\boxed", "\\fbox")
_NUMBER = r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|[-+−]?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_PHRASE_RE = re.compile(r"answer\s*(?:is|=|:)\s*:?", flags=re.IGNORECASE)
_SENTENCE_END_RE = re.compile(r"\.(?:\s|$)")


def _balanced_group(text: str, open_index: int) -> str | None:
    """The content of the brace group opening at `open_index`, or None if unbalanced."""
    depth = 0
    for index in range(open_index, len(text)):
        char = text[index]
        if char == "{" and (index == 0 or text[index - 1] != "\\"):
            depth += 1
        elif char == "}" and text[index - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : index]
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` (nested braces kept), else None.

    Also accepts the brace-less form `\\boxed 5` that some models emit. A malformed last box
    (unbalanced braces) falls back to the one before it.
    """
    starts = sorted(
        (match.start(), match.end())
        for command in _BOXED_COMMANDS
        for match in re.finditer(re.escape(command), text)
    )
    for _, rest in reversed(starts):
        if rest < len(text) and text[rest] == "{":
            content = _balanced_group(text, rest)
            if content is not None:
                return content.strip()
        elif rest < len(text) and text[rest] == " ":
            match = re.match(r"\s+([^\s$]+)", text[rest:])
            if match:
                return match.group(1)
    return None


def extract_hash_answer(text: str) -> str | None:
    """Text after the last GSM8K-style `####` marker, up to the end of its line."""
    index = text.rfind("####")
    if index < 0:
        return None
    line = text[index + 4 :].strip().splitlines()
    answer = line[0].strip() if line else ""
    return answer or None


def extract_phrase_answer(text: str) -> str | None:
    """Answer after the last "The (final) answer is ..." / "Answer:" phrase."""
    matches = list(_PHRASE_RE.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end() :].strip()
    answer = rest.splitlines()[0].strip() if rest else ""
    # The answer ends with its sentence; "3.5" keeps its point because no space follows it.
    end = _SENTENCE_END_RE.search(answer)
    answer = answer[: end.start()] if end else answer
    boxed = extract_boxed(answer)
    if boxed is not None:
        return boxed
    # Sentences end with a period; a trailing "." is punctuation, not a decimal point.
    answer = answer.rstrip(".").strip().strip("$").strip()
    return answer or None


def extract_last_number(text: str) -> str | None:
    """The last number on the last non-empty line (thousands commas and fractions kept)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    numbers = _NUMBER_RE.findall(lines[-1])
    return numbers[-1] if numbers else None


_EXTRACTORS = {
    "boxed": extract_boxed,
    "hash": extract_hash_answer,
    "phrase": extract_phrase_answer,
    "last_number": extract_last_number,
}


def extract_answer(text: str, *, strategies: Sequence[Strategy] = ALL_STRATEGIES) -> str | None:
    """The first answer found by `strategies`, tried in order; None when none matches."""
    for strategy in strategies:
        extractor = _EXTRACTORS.get(strategy)
        if extractor is None:
            raise ConfigError(
                f"unknown extraction strategy {strategy!r}; expected one of {ALL_STRATEGIES}"
            )
        answer = extractor(text)
        if answer is not None:
            return answer
    return None
