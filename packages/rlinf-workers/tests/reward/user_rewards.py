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
