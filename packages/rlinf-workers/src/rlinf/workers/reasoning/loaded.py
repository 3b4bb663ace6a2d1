"""What a reasoning run loaded, printed before it starts (`Loaded`): the model (parameters,
stored dtype, the precision it trains in), the tokenizer, the problems of each split, and
the first prompt exactly as the model sees it (template, system prompt and the tokenizer's
special tokens decoded from its ids). A user who points a run at their own model or data
sees at once whether the right ones came in.

The model is counted by `rlinf.workers.models.sources.ModelSource.facts`, which reads no
Hugging Face weights and builds no warm start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlinf.envs.math.templates import TemplateName
from rlinf.workers.models.sources import SourceFacts
from rlinf.workers.reasoning.problems import SeededProblems
from rlinf.workers.rollout.worker import encode_prompt

__all__ = ["Loaded"]


@dataclass(frozen=True)
class Loaded:
    """What a run loaded (module docstring)."""

    model: str
    """Where the model comes from (a folder, or "tiny model from config")."""
    parameters: int
    stored_dtype: str
    """The weights' dtype as stored (the Hugging Face config's, or the built model's)."""
    precision: str
    """The precision the actor trains in."""
    tokenizer: str
    """Tokenizer class and vocabulary size."""
    train_problems: int | None
    """Training problems given (None: generated on the fly)."""
    heldout_problems: int
    data: str
    """Where the problems come from."""
    first_prompt: str = ""
    """The first training prompt as the model sees it (its token ids decoded)."""

    @classmethod
    def of(cls, facts: SourceFacts, problems: SeededProblems, *, precision: str, data: str,
           template: TemplateName, system_prompt: str | None) -> Loaded:
        """The banner of a run that trains `facts`' model on `problems`."""
        tokenizer: Any = facts.tokenizer
        first = encode_prompt(problems(1, 1)[0], tokenizer, template=template,
                              system_prompt=system_prompt)
        return cls(model=facts.where, parameters=facts.parameters,
                   stored_dtype=facts.stored_dtype, precision=precision,
                   tokenizer=f"{type(tokenizer).__name__} (vocabulary {len(tokenizer)})",
                   train_problems=problems.train_size, heldout_problems=len(problems.heldout),
                   data=data, first_prompt=str(tokenizer.decode(first)))

    def lines(self) -> list[str]:
        """The banner, one line each for model, tokenizer, data and the first prompt."""
        train = ("generated on the fly" if self.train_problems is None
                 else f"{self.train_problems} train")
        return [f"model: {self.model} — {_count(self.parameters)} parameters, stored "
                f"{self.stored_dtype}, trains in {self.precision}",
                f"tokenizer: {self.tokenizer}",
                f"data: {self.data} — {train}, {self.heldout_problems} held-out",
                f"first prompt: {self.first_prompt!r}"]


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)
