"""Offline procedural math problems: arithmetic expressions and linear equations in x.

Deterministic: the same `GeneratorConfig` (seed included) and split always give the same
problems, on any machine (`random.Random` seeded with a string is platform independent).

Splits never overlap: a hash of a problem's compact form, read as a number u in [0, 1),
puts it in the held-out split when u < `heldout_fraction`, in the validation split when
u < `heldout_fraction + validation_fraction` (empty by default), and in training otherwise.
The hash ignores the seed, so no seed of a config can produce a training problem that
another seed produces as held-out or validation.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from rlinf.envs.errors import ConfigError, GeneratorError
from rlinf.envs.math.problem import MathProblem

Kind = Literal["arithmetic", "linear", "mixed"]
Split = Literal["train", "validation", "heldout"]
SPLITS: tuple[Split, ...] = ("train", "validation", "heldout")
OPERATORS = ("+", "-", "*", "/")


@dataclass(frozen=True)
class GeneratorConfig:
    """Difficulty knobs of the procedural generator."""

    kind: Kind = "arithmetic"
    """Problem family: arithmetic expressions, linear equations in x, or both (50/50)."""
    min_digits: int = 1
    """Fewest decimal digits of an operand (arithmetic) or of the solution x (linear)."""
    max_digits: int = 2
    """Most decimal digits of an operand or of the solution x."""
    min_operands: int = 2
    """Fewest operands of an arithmetic expression."""
    max_operands: int = 2
    """Most operands of an arithmetic expression."""
    operators: tuple[str, ...] = ("+", "-")
    """Operators to draw from, a subset of + - * / (usual precedence applies)."""
    non_negative: bool = False
    """Reject problems whose answer is negative (also keeps x >= 0 for equations)."""
    integer_answers: bool = True
    """Reject problems whose answer is not an integer (matters with "/")."""
    coefficient_digits: int = 1
    """Digits of the coefficient a and constant b in linear equations a*x + b = c."""
    heldout_fraction: float = 0.1
    """Share of the problem space reserved for the held-out split (by hash, not by seed)."""
    validation_fraction: float = 0.0
    """Share reserved for a validation split next to the held-out one (0: none), so a
    choice made while training (a stop point, a learning rate) never sees the held-out set."""
    seed: int = 0
    """Seed of the problem stream; each split has its own stream."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits:
            raise ConfigError(
                f"need 1 <= min_digits <= max_digits, got {self.min_digits}, {self.max_digits}"
            )
        if not 2 <= self.min_operands <= self.max_operands:
            raise ConfigError(
                "need 2 <= min_operands <= max_operands, "
                f"got {self.min_operands}, {self.max_operands}"
            )
        unknown = set(self.operators) - set(OPERATORS)
        if not self.operators or unknown:
            raise ConfigError(
                f"operators must be a non-empty subset of {OPERATORS}, got {self.operators}"
            )
        if self.kind not in ("arithmetic", "linear", "mixed"):
            raise ConfigError(f"kind must be arithmetic, linear or mixed, got {self.kind!r}")
        if self.coefficient_digits < 1:
            raise ConfigError(f"coefficient_digits must be >= 1, got {self.coefficient_digits}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ConfigError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if not 0.0 <= self.validation_fraction < 1.0 - self.heldout_fraction:
            raise ConfigError(
                f"validation_fraction must be in [0, 1 - heldout_fraction = "
                f"{1.0 - self.heldout_fraction:g}), got {self.validation_fraction}; "
                "some of the space must be left for training"
            )

    @classmethod
    def for_level(cls, level: int, *, seed: int = 0) -> GeneratorConfig:
        """A preset ladder: 1 = one-digit sums ... 5 = linear equations with 2-digit x."""
        presets: dict[int, GeneratorConfig] = {
            1: cls(max_digits=1, seed=seed),
            2: cls(max_digits=2, seed=seed),
            3: cls(max_digits=2, max_operands=3, operators=("+", "-", "*"), seed=seed),
            4: cls(min_digits=2, max_digits=3, min_operands=3, max_operands=4,
                   operators=("+", "-", "*"), seed=seed),
            5: cls(kind="linear", max_digits=2, coefficient_digits=2, seed=seed),
        }
        if level not in presets:
            raise ConfigError(f"difficulty level must be one of {sorted(presets)}, got {level}")
        return presets[level]


def split_of(compact: str, *, heldout_fraction: float, validation_fraction: float = 0.0) -> Split:
    """The split a problem with this compact form belongs to (stable across seeds)."""
    digest = hashlib.blake2b(compact.encode(), digest_size=8).digest()
    position = int.from_bytes(digest, "big") / 2**64
    if position < heldout_fraction:
        return "heldout"
    if position < heldout_fraction + validation_fraction:
        return "validation"
    return "train"


def evaluate(operands: list[int], operators: list[str]) -> Fraction:
    """Exact value of operands joined by operators, with * and / binding tighter."""
    if len(operators) != len(operands) - 1:
        raise ConfigError(f"{len(operands)} operands need {len(operands) - 1} operators")
    terms: list[Fraction] = [Fraction(operands[0])]
    signs: list[str] = ["+"]
    for operator, operand in zip(operators, operands[1:], strict=True):
        if operator == "*":
            terms[-1] *= operand
        elif operator == "/":
            terms[-1] /= operand  # the caller never draws a zero divisor
        else:
            terms.append(Fraction(operand))
            signs.append(operator)
    return sum((t if s == "+" else -t for t, s in zip(terms, signs, strict=True)), Fraction(0))


def format_number(value: Fraction) -> str:
    """Integers as "42", other rationals as reduced "a/b"."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


class ProblemGenerator:
    """Seeded generator of `MathProblem`s; see the module docstring for the guarantees."""

    def __init__(self, config: GeneratorConfig | None = None) -> None:
        self.config = config or GeneratorConfig()

    def _number(self, rng: random.Random, digits: int) -> int:
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return rng.randint(low, 10**digits - 1)

    def _arithmetic(self, rng: random.Random) -> MathProblem | None:
        cfg = self.config
        count = rng.randint(cfg.min_operands, cfg.max_operands)
        operands = [self._number(rng, rng.randint(cfg.min_digits, cfg.max_digits))
                    for _ in range(count)]
        operators = [rng.choice(cfg.operators) for _ in range(count - 1)]
        if any(op == "/" and b == 0 for op, b in zip(operators, operands[1:], strict=True)):
            return None
        value = evaluate(operands, operators)
        if (cfg.integer_answers and value.denominator != 1) or (cfg.non_negative and value < 0):
            return None
        expression = str(operands[0]) + "".join(
            f"{op}{b}" for op, b in zip(operators, operands[1:], strict=True))
        spaced = str(operands[0]) + "".join(
            f" {op} {b}" for op, b in zip(operators, operands[1:], strict=True))
        return MathProblem(
            question=f"What is {spaced}?",
            answer=format_number(value),
            metadata={"kind": "arithmetic", "compact": expression + "="},
        )

    def _linear(self, rng: random.Random) -> MathProblem:
        cfg = self.config
        x = self._number(rng, rng.randint(cfg.min_digits, cfg.max_digits))
        if not cfg.non_negative and rng.random() < 0.5:
            x = -x
        top = 10**cfg.coefficient_digits - 1
        a = rng.randint(1, top) * rng.choice((1, -1))
        b = rng.randint(-top, top)
        c = a * x + b
        coefficient = {1: "", -1: "-"}.get(a, str(a))
        constant = "" if b == 0 else f"{b:+d}"
        equation = f"{coefficient}x{constant}={c}"
        return MathProblem(
            question=f"Solve for x: {equation}",
            answer=str(x),
            metadata={"kind": "linear", "compact": f"{equation};x="},
        )

    def _draws(self, split: Split, *, batch: int | None = None) -> Iterator[MathProblem | None]:
        """One item per random draw: the problem, or None when it was rejected. `batch`
        selects a stream of its own (see `batch`); None is the split's main stream."""
        cfg = self.config
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
        if split == "validation" and cfg.validation_fraction == 0.0:
            raise ConfigError("the validation split is empty: set "
                              "GeneratorConfig.validation_fraction > 0 to reserve one")
        suffix = "" if batch is None else f":batch{batch}"
        rng = random.Random(f"rlinf-math:{cfg.seed}:{split}{suffix}")
        while True:
            kind = cfg.kind if cfg.kind != "mixed" else rng.choice(("arithmetic", "linear"))
            problem = self._arithmetic(rng) if kind == "arithmetic" else self._linear(rng)
            if problem is None or split_of(
                    problem.metadata["compact"], heldout_fraction=cfg.heldout_fraction,
                    validation_fraction=cfg.validation_fraction) != split:
                yield None
                continue
            yield MathProblem(problem.question, problem.answer, None,
                              {**problem.metadata, "split": split, "seed": cfg.seed})

    def stream(self, *, split: Split = "train") -> Iterator[MathProblem]:
        """An endless, deterministic stream of problems of `split` (duplicates possible).

        Never yields if the configured space has no problem of `split`; `generate` bounds
        its draws and raises instead.
        """
        return (problem for problem in self._draws(split) if problem is not None)

    def generate(
        self, count: int, *, split: Split = "train", unique: bool = False,
        max_attempts: int | None = None,
    ) -> list[MathProblem]:
        """The first `count` problems of `split`'s stream (distinct ones if `unique`).

        Raises GeneratorError when fewer than `count` (distinct) problems turn up within
        `max_attempts` random draws (default 200 per requested problem): the configured
        space is too small, or rejects almost everything.
        """
        return self._take(self._draws(split), count, split=split, unique=unique,
                          max_attempts=max_attempts)

    def batch(self, index: int, size: int, *, split: Split = "train") -> list[MathProblem]:
        """The `index`-th batch of `size` problems (0-based) of `split`: a pure function of
        the config, `index` and `size`, drawn from a stream of its own, so batch k costs
        O(size) whatever k, and any process (a rollout worker, a resumed run) that asks for
        batch k gets the same problems. Batches may share problems (as the stream may).

        Raises GeneratorError as `generate` does.
        """
        if index < 0:
            raise ConfigError(f"index must be >= 0, got {index}")
        return self._take(self._draws(split, batch=index), size, split=split, unique=False,
                          max_attempts=None)

    def _take(self, draws: Iterator[MathProblem | None], count: int, *, split: Split,
              unique: bool, max_attempts: int | None) -> list[MathProblem]:
        if count < 0:
            raise ConfigError(f"count must be >= 0, got {count}")
        budget = max_attempts if max_attempts is not None else 200 * max(count, 1)
        problems: list[MathProblem] = []
        seen: set[str] = set()
        for _ in range(budget):
            if len(problems) == count:
                return problems
            problem = next(draws)
            if problem is None:
                continue
            key = problem.metadata["compact"]
            if unique and key in seen:
                continue
            seen.add(key)
            problems.append(problem)
        if len(problems) == count:
            return problems
        raise GeneratorError(
            f"found only {len(problems)} of {count} {'distinct ' if unique else ''}"
            f"{split} problems in {budget} draws; widen the digits/operands/operators"
        )
