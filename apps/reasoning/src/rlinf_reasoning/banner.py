"""What a run loaded, printed before it starts (`rlinf.workers.reasoning.loaded.Loaded`),
and the checks that need the loaded tokenizer and problems: ``data.template=chat`` with a
tokenizer that has no chat template is refused here, before any worker starts, as is a
reward function of one's own (``reward.functions``) that fails on a real sample (called
once with a held-out problem's prompt and columns and its reference answer as the
response) and a tool format the tokenizer cannot write.
"""

from __future__ import annotations

from typing import Any

from rlinf.workers.reasoning.loaded import Loaded
from rlinf.workers.reasoning.problems import SeededProblems
from rlinf_reasoning.config import ReasoningConfig, check_reward
from rlinf_reasoning.errors import InvalidConfigError
from rlinf_reasoning.spec import FlowSpec

__all__ = ["Loaded", "describe_loaded"]


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
    return Loaded.of(facts, source, precision=cfg.model.precision, data=data,
                     template=spec.rollout.template, system_prompt=spec.rollout.system_prompt)


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
    """Call each of the user's reward functions once on a real sample: a held-out problem
    with its prompt and columns, its reference answer as the response."""
    if source.heldout:
        from rlinf.workers.reward import RewardSample

        problem = source.heldout[0]
        check_reward(cfg, RewardSample(problem.answer, problem.answer, problem.prompt,
                                       problem.dataset_columns),
                     allowed="a function that scores a real sample")
