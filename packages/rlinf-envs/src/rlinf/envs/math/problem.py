"""The one record type of math tasks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ChatMessage = Mapping[str, str]
"""One chat message: ``{"role": ..., "content": ...}``."""


@dataclass(frozen=True)
class MathProblem:
    """A math question with its reference final answer."""

    question: str
    """The problem statement shown to the model (before any prompt template); for a prompt
    given as chat messages, the last user message."""
    answer: str
    """The reference final answer only (e.g. "42", "\\frac{1}{2}"), not a worked solution."""
    solution: str | None = None
    """The worked reference solution when the source has one (GSM8K rationale, MATH solution)."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Source-specific extras: dataset name, level, generator kind, compact form, ..."""
    messages: Sequence[ChatMessage] = ()
    """The prompt as chat messages when the source gives it so (veRL's layout): rendered
    with the tokenizer's chat template as they are."""
    columns: Mapping[str, Any] = field(default_factory=dict)
    """The dataset record's columns as read (JSON values), which reward functions receive;
    empty for generated problems (`dataset_columns` then describes the problem)."""

    @property
    def prompt(self) -> str | list[dict[str, str]]:
        """The prompt as the dataset has it: the chat messages, or the question text."""
        return [dict(m) for m in self.messages] if self.messages else self.question

    @property
    def dataset_columns(self) -> dict[str, Any]:
        """The columns a reward function receives: the record's, or for a generated problem
        its question, answer and metadata."""
        if self.columns:
            return dict(self.columns)
        return {**self.metadata, "question": self.question, "answer": self.answer,
                "solution": self.solution}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict; `MathProblem.from_dict` reads it back."""
        out: dict[str, Any] = {
            "question": self.question,
            "answer": self.answer,
            "solution": self.solution,
            "metadata": dict(self.metadata),
        }
        if self.messages:
            out["messages"] = [dict(m) for m in self.messages]
        return out

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> MathProblem:
        """Inverse of `to_dict`."""
        return cls(
            question=str(record["question"]),
            answer=str(record["answer"]),
            solution=record.get("solution"),
            metadata=dict(record.get("metadata") or {}),
            messages=tuple(dict(m) for m in record.get("messages") or ()),
        )
