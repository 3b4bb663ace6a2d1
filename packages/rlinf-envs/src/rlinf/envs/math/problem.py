"""The one record type of math tasks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MathProblem:
    """A math question with its reference final answer."""

    question: str
    """The problem statement shown to the model (before any prompt template)."""
    answer: str
    """The reference final answer only (e.g. "42", "\\frac{1}{2}"), not a worked solution."""
    solution: str | None = None
    """The worked reference solution when the source has one (GSM8K rationale, MATH solution)."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Source-specific extras: dataset name, level, generator kind, compact form, ..."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict; `MathProblem.from_dict` reads it back."""
        return {
            "question": self.question,
            "answer": self.answer,
            "solution": self.solution,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> MathProblem:
        """Inverse of `to_dict`."""
        return cls(
            question=str(record["question"]),
            answer=str(record["answer"]),
            solution=record.get("solution"),
            metadata=dict(record.get("metadata") or {}),
        )
