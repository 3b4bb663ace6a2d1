"""Reward functions as a user writes them, imported by name in test_reward_worker.py."""

from __future__ import annotations


def exact_match(response: str, answer: str) -> float:
    return 1.0 if response.strip() == answer.strip() else -0.5


def broken(response: str, answer: str) -> float:
    return float(int(response))  # raises on a non-number


def not_a_number(response: str, answer: str) -> object:
    return "high"


class Scorers:
    @staticmethod
    def length(response: str, answer: str) -> int:
        return len(response)


THRESHOLD = 0.5


def level_bonus(prompts, completions, ground_truth, level, **kwargs):
    """TRL's shape: a dataset column (`level`) by name."""
    return [float(c.strip() == g) * lvl
            for c, g, lvl in zip(completions, ground_truth, level, strict=True)]


def chat_length(prompts, completions):
    """TRL's conversational shape: completions as assistant messages."""
    return [len(c[0]["content"]) if isinstance(c, list) else None for c in completions]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """veRL's shape, as veRL's gsm8k.py writes it (a dict result is allowed too)."""
    if data_source != "openai/gsm8k":
        raise NotImplementedError(data_source)
    score = 1.0 if solution_str.strip() == ground_truth else 0.0
    return {"score": score + 0.01 * extra_info["index"], "acc": score}


def too_few(prompts, completions, **kwargs):
    return [1.0]


def three_arguments(a, b, c):
    return 0.0
