"""Accuracy of a causal LM on math problems under the short template ("12+7=" → "19").

Shared by the reasoning app's warm-start script, its RL headroom check and its tests, so all
of them measure accuracy the same way: prompts left-padded, `generate` until EOS or
`max_new_tokens`, the last number of the response scored against the reference answer.
`tool_accuracy` measures a model that calls the calculator (the tag format): the last
number of its final turn, after the tool's answer, is scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rlinf.envs.math import MathProblem, format_prompt, score
from rlinf.envs.math.extract import Strategy

__all__ = ["ANSWER_STRATEGIES", "ToolAccuracy", "accuracy", "generate", "rewards",
           "tool_accuracy", "tool_target"]

ANSWER_STRATEGIES: tuple[Strategy, ...] = ("last_number",)
"""How answers are extracted from a tiny model's response (no boxing, no phrases)."""


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    do_sample: bool,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(prompt_ids, prompt_mask, response_ids)`` for `prompts`, one response each.

    Prompts are left-padded (the tokenizer's default); responses are right-padded with the
    pad id after EOS. Sampling draws from torch's global RNG: seed it for reproducibility.
    """
    batch = tokenizer(list(prompts), return_tensors="pt", padding=True)
    device = next(model.parameters()).device
    prompt_ids = batch["input_ids"].to(device)
    prompt_mask = batch["attention_mask"].to(device)
    sequences = model.generate(  # type: ignore[operator]
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=temperature if do_sample else None,
        top_k=None,
        top_p=None,
    )
    return prompt_ids, prompt_mask, sequences[:, prompt_ids.shape[1]:]


def rewards(
    tokenizer: PreTrainedTokenizerBase, response_ids: torch.Tensor, answers: Sequence[str]
) -> list[float]:
    """1.0 for each response whose last number equals its reference answer, else 0.0."""
    texts = tokenizer.batch_decode(response_ids, skip_special_tokens=True)
    return [score(text, answer, strategies=ANSWER_STRATEGIES, backend="builtin")
            for text, answer in zip(texts, answers, strict=True)]


def accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[MathProblem],
    *,
    max_new_tokens: int = 6,
    do_sample: bool = False,
    temperature: float = 1.0,
    batch_size: int = 256,
) -> float:
    """Share of `problems` answered correctly, greedy by default (one sample each if not)."""
    if not problems:
        return 0.0
    correct = 0.0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start:start + batch_size]
        prompts = [format_prompt(p, template="short") for p in chunk]
        _, _, response_ids = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                      do_sample=do_sample, temperature=temperature)
        correct += sum(rewards(tokenizer, response_ids, [p.answer for p in chunk]))
    return correct / len(problems)


def tool_target(problem: MathProblem) -> tuple[str, str, str]:
    """What a model that uses the calculator writes for `problem`, in three parts: its call,
    the tool's answer (the tool writes it), its final answer —
    ``("<calculator>12+7</calculator>", "<result>19</result>", "19")``."""
    expression = format_prompt(problem, template="short").removesuffix("=")
    return (f"<calculator>{expression}</calculator>", f"<result>{problem.answer}</result>",
            problem.answer)


@dataclass(frozen=True)
class ToolAccuracy:
    """Greedy accuracy of a tool-calling model, with its use of the tool."""

    accuracy: float
    """Share of problems whose final answer is right."""
    calls_per_answer: float
    """Tool calls per problem."""
    error_rate: float
    """Share of calls that returned an error."""


def tool_accuracy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                  problems: Sequence[MathProblem], *, max_new_tokens: int = 32,
                  max_turns: int = 2, batch_size: int = 256) -> ToolAccuracy:
    """`ToolAccuracy` of `model` on `problems`, greedy, through `ToolLoop` with the
    calculator in the tag format; each final turn is read as the reward reads it."""
    from rlinf.workers.reward import RewardScorer
    from rlinf.workers.rollout import HFRolloutEngine, RolloutBatch, SamplingConfig
    from rlinf.workers.rollout.tool_loop import ToolLoop, ToolLoopConfig

    if not problems:
        return ToolAccuracy(0.0, 0.0, 0.0)
    engine = HFRolloutEngine(model, eos_token_id=int(tokenizer.eos_token_id),
                             pad_token_id=int(tokenizer.pad_token_id), offload_policy="host")
    loop = ToolLoop.build(engine, tokenizer, ToolLoopConfig(max_turns=max_turns))
    reader = RewardScorer(tokenizer)
    greedy = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0)
    correct = calls = errors = 0.0
    try:
        for start in range(0, len(problems), batch_size):
            chunk = problems[start:start + batch_size]
            prompts = [tokenizer.encode(format_prompt(p, template="short")) for p in chunk]
            batch = RolloutBatch.from_samples(
                loop.generate(prompts, sampling=greedy), answers=[p.answer for p in chunk],
                group_size=1, pad_token_id=int(tokenizer.pad_token_id))
            correct += sum(score(text, p.answer, strategies=ANSWER_STRATEGIES,
                                 backend="builtin")
                           for text, p in zip(reader.decode(batch), chunk, strict=True))
            assert batch.tool_calls is not None and batch.tool_errors is not None
            calls += float(batch.tool_calls.sum())
            errors += float(batch.tool_errors.sum())
    finally:
        loop.shutdown()
    return ToolAccuracy(correct / len(problems), calls / len(problems),
                        errors / calls if calls else 0.0)
