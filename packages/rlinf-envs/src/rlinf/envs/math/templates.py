"""Prompt templates: how a `MathProblem` is shown to a model.

- `plain`: the question plus an instruction to box the final answer (base models).
- `chat`: system + user messages for chat models (`format_chat`), or its plain text form;
  a problem whose source gives its prompt as chat messages keeps those.
- `short`: the compact form for tiny character-level models, e.g. "12+7=" whose expected
  completion is "19". Generated problems carry it in `metadata["compact"]`; other problems
  fall back to the question followed by "=", unless it ends with "=" already (a user's
  "49-97=" stays "49-97=", not "49-97==", which no model trained on the form answers).
"""

from __future__ import annotations

from typing import Literal

from rlinf.envs.errors import ConfigError
from rlinf.envs.math.problem import MathProblem

TemplateName = Literal["plain", "chat", "short"]
TEMPLATES: tuple[TemplateName, ...] = ("plain", "chat", "short")

PLAIN_INSTRUCTION = "Solve the problem step by step and put the final answer within \\boxed{}."
DEFAULT_SYSTEM_PROMPT = (
    "You are a careful mathematician. Reason step by step, then give the final answer "
    "within \\boxed{}."
)


def compact_form(problem: MathProblem) -> str:
    """The short-template prompt: `metadata["compact"]` if present, else the question ending
    in one "=" (added when it has none)."""
    compact = problem.metadata.get("compact")
    if isinstance(compact, str) and compact:
        return compact
    question = problem.question.strip()
    return question if question.endswith("=") else question + "="


def format_chat(
    problem: MathProblem, *, system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
) -> list[dict[str, str]]:
    """Chat messages (`role`/`content`) ready for a tokenizer's `apply_chat_template`: the
    problem's own messages as they are when its source gave some (veRL's layout: they hold
    their instructions, so `system_prompt` is not added), else `system_prompt` and the
    question."""
    if problem.messages:
        return [dict(m) for m in problem.messages]
    messages = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    messages.append({"role": "user", "content": problem.question.strip()})
    return messages


def format_prompt(
    problem: MathProblem,
    *,
    template: TemplateName = "plain",
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
) -> str:
    """The prompt text for `problem` under `template` (see the module docstring)."""
    if template == "plain":
        return f"{problem.question.strip()}\n{PLAIN_INSTRUCTION}\n"
    if template == "short":
        return compact_form(problem)
    if template == "chat":
        # Plain-text rendering for engines without a chat template; prefer format_chat.
        parts = [f"{m['role'].capitalize()}: {m['content'].strip()}"
                 for m in format_chat(problem, system_prompt=system_prompt)]
        return "\n".join([*parts, "Assistant:"])
    raise ConfigError(f"unknown prompt template {template!r}; expected one of {TEMPLATES}")
