"""What a run loaded, printed before it starts: the model (parameters, stored dtype, the
precision it trains in), the tokenizer, the problems of each split, and the first prompt
exactly as the model sees it (template, system prompt and the tokenizer's special tokens
decoded from its ids). A user who points `model.dir` or `data.path` at their own files
sees at once whether the right ones came in; ``data.template=chat`` with a tokenizer that
has no chat template is refused here,
before any worker starts, as is a reward function of one's own (``reward.functions``) that
fails on a real sample: each is called once with a held-out problem's prompt and columns
and its reference answer as the response.

The model is counted by `rlinf.workers.models.sources.ModelSource.facts`, which reads no
Hugging Face weights and builds no warm start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlinf.workers.reasoning.problems import SeededProblems
from rlinf.workers.rollout.worker import encode_prompt
from rlinf_reasoning.config import ReasoningConfig
from rlinf_reasoning.errors import InvalidConfigError
from rlinf_reasoning.spec import FlowSpec

__all__ = ["Loaded", "describe_loaded"]


@dataclass(frozen=True)
class Loaded:
    """What `describe_loaded` found."""

    model: str
    """Where the model comes from (a folder, or "tiny model from config")."""
    parameters: int
    stored_dtype: str
    """The weights' dtype as stored (the Hugging Face config's, or the built model's)."""
    precision: str
    """The precision the actor trains in (``model.precision``)."""
    tokenizer: str
    """Tokenizer class and vocabulary size."""
    train_problems: int | None
    """Training problems in the file (None: generated on the fly)."""
    heldout_problems: int
    data: str
    """Where the problems come from."""
    first_prompt: str = ""
    """The first training prompt as the model sees it (its token ids decoded)."""

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


def describe_loaded(cfg: ReasoningConfig, spec: FlowSpec, source: SeededProblems) -> Loaded:
    """Count what `spec` and `source` will train on (module docstring)."""
    facts = spec.model.facts()
    tokenizer = facts.tokenizer
    if cfg.data.template == "chat" and not getattr(tokenizer, "chat_template", None):
        raise InvalidConfigError(
            "data.template", "chat",
            f"'plain' or 'short' for this model: its {type(tokenizer).__name__} has no chat "
            "template (a chat model's tokenizer_config.json carries one)")
    _try_reward_function(cfg, source)
    _try_tool_format(spec, tokenizer)
    data = (f"generated level {cfg.data.level}" if cfg.data.path is None
            else str(cfg.data.path) + (f" + {cfg.data.heldout_path}"
                                       if cfg.data.heldout_path else ""))
    first = encode_prompt(source(1, 1)[0], tokenizer, template=spec.rollout.template,
                          system_prompt=spec.rollout.system_prompt)
    return Loaded(model=facts.where, parameters=facts.parameters,
                  stored_dtype=facts.stored_dtype, precision=cfg.model.precision,
                  tokenizer=f"{type(tokenizer).__name__} (vocabulary {len(tokenizer)})",
                  train_problems=source.train_size, heldout_problems=len(source.heldout),
                  data=data, first_prompt=str(tokenizer.decode(first)))


def _try_tool_format(spec: FlowSpec, tokenizer: Any) -> None:
    """Build the tool format with the run's tokenizer: Hermes calls need its chat template
    to render the tools' answers."""
    if spec.tools is None:
        return
    from rlinf.workers.errors import ConfigError as WorkersConfigError
    from rlinf.workers.rollout.tool_formats import make_tool_format

    try:
        make_tool_format(spec.tools.format, tokenizer, spec.tools.registry())
    except WorkersConfigError as exc:
        raise InvalidConfigError("tools.format", spec.tools.format,
                                 f"a format this model's tokenizer can write ({exc})") from exc


def _try_reward_function(cfg: ReasoningConfig, source: SeededProblems) -> None:
    """Call each of the user's reward functions once on a real sample (a held-out problem
    with its prompt and columns, its reference answer as the response); one config error
    naming the function and the sample when it raises or returns no finite number."""
    if cfg.reward.chosen == ("math",) or not source.heldout:
        return
    from rlinf.workers.errors import RewardFunctionError
    from rlinf.workers.reward import (
        BUILTIN_MATH,
        RewardSample,
        call_reward_function,
        load_reward_terms,
    )

    problem = source.heldout[0]
    sample = RewardSample(problem.answer, problem.answer, problem.prompt,
                          problem.dataset_columns)
    key = "reward.function" if cfg.reward.function is not None else "reward.functions"
    terms = load_reward_terms(cfg.reward.chosen, cfg.reward.weights,
                              builtin=lambda response, answer: 0.0)
    for term in terms:
        if term.spec == BUILTIN_MATH:
            continue
        try:
            call_reward_function(term, sample)
        except RewardFunctionError as exc:
            raise InvalidConfigError(key, term.spec,
                                     f"a function that scores a real sample ({exc})") from exc
