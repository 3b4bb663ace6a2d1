from __future__ import annotations

import re
from fractions import Fraction

import pytest

from rlinf.envs import ConfigError, GeneratorError
from rlinf.envs.math import GeneratorConfig, ProblemGenerator, parse_number, split_of
from rlinf.envs.math.generator import evaluate


def _compacts(config: GeneratorConfig, count: int, split: str = "train") -> list[str]:
    problems = ProblemGenerator(config).generate(count, split=split)  # type: ignore[arg-type]
    return [p.metadata["compact"] for p in problems]


def test_same_config_same_problems() -> None:
    config = GeneratorConfig.for_level(3, seed=7)
    assert _compacts(config, 50) == _compacts(config, 50)
    assert _compacts(config, 50) != _compacts(GeneratorConfig.for_level(3, seed=8), 50)


def test_train_and_heldout_never_overlap_across_seeds() -> None:
    train = {c for seed in range(3) for c in _compacts(GeneratorConfig(seed=seed), 400)}
    heldout = {
        c for seed in range(3)
        for c in _compacts(GeneratorConfig(seed=seed), 100, split="heldout")
    }
    assert train and heldout
    assert not train & heldout
    for compact in heldout:
        assert split_of(compact, heldout_fraction=0.1) == "heldout"


def test_a_validation_split_is_carved_from_training_and_leaves_heldout_alone() -> None:
    plain = GeneratorConfig.for_level(2)
    config = GeneratorConfig(max_digits=2, validation_fraction=0.1)
    splits = {split: set(_compacts(config, 300, split=split))
              for split in ("train", "validation", "heldout")}
    assert all(splits.values())
    assert not splits["train"] & splits["validation"]
    assert not splits["train"] & splits["heldout"]
    assert not splits["validation"] & splits["heldout"]
    # the held-out split is the one a config without validation has
    assert _compacts(config, 50, split="heldout") == _compacts(plain, 50, split="heldout")
    # validation problems are training problems when no validation split is asked for
    for compact in splits["validation"]:
        assert split_of(compact, heldout_fraction=0.1, validation_fraction=0.1) == "validation"
        assert split_of(compact, heldout_fraction=0.1) == "train"
    assert {p.metadata["split"] for p in
            ProblemGenerator(config).generate(5, split="validation")} == {"validation"}


def test_an_empty_validation_split_is_refused() -> None:
    with pytest.raises(ConfigError, match="validation_fraction"):
        ProblemGenerator().generate(1, split="validation")


def test_answers_are_correct() -> None:
    config = GeneratorConfig(max_digits=3, min_operands=2, max_operands=4,
                             operators=("+", "-", "*", "/"), integer_answers=False)
    for problem in ProblemGenerator(config).generate(200):
        expression = problem.metadata["compact"].removesuffix("=")
        tokens = re.findall(r"\d+|[-+*/]", expression)
        operands = [int(t) for t in tokens[::2]]
        # Python's own precedence over exact Fractions is the independent oracle.
        oracle = eval("".join(f"Fraction({t})" if t.isdigit() else t for t in tokens))
        assert evaluate(operands, tokens[1::2]) == oracle
        assert parse_number(problem.answer) == oracle


def test_linear_equations_solve() -> None:
    for problem in ProblemGenerator(GeneratorConfig.for_level(5)).generate(100):
        equation = problem.metadata["compact"].removesuffix(";x=")
        left, right = equation.split("=")
        x = int(problem.answer)
        assert eval(left.replace("x", f"*({x})").lstrip("*").replace("-*", "-1*")) == int(right)
        assert problem.question == f"Solve for x: {equation}"


def test_difficulty_knobs() -> None:
    config = GeneratorConfig(min_digits=3, max_digits=3, min_operands=4, max_operands=4,
                             operators=("*",), non_negative=True)
    for problem in ProblemGenerator(config).generate(50):
        operands = problem.metadata["compact"].removesuffix("=").split("*")
        assert len(operands) == 4
        assert all(len(op) == 3 for op in operands)
        assert int(problem.answer) >= 0
    one_digit = GeneratorConfig(max_digits=1, operators=("+",))
    assert all(int(p.answer) <= 18 for p in ProblemGenerator(one_digit).generate(100))


def test_integer_answers_with_division() -> None:
    config = GeneratorConfig(operators=("/",), integer_answers=True)
    problems = ProblemGenerator(config).generate(30)
    assert all(Fraction(p.answer).denominator == 1 for p in problems)


def test_short_template_form() -> None:
    problem = ProblemGenerator(GeneratorConfig(max_digits=1, seed=1)).generate(1)[0]
    assert re.fullmatch(r"\d[-+]\d=", problem.metadata["compact"])
    assert problem.metadata["split"] == "train"


def test_unique_exhausts_small_space() -> None:
    config = GeneratorConfig(max_digits=1, operators=("+",))
    problems = ProblemGenerator(config).generate(80, unique=True)
    assert len({p.metadata["compact"] for p in problems}) == 80
    with pytest.raises(GeneratorError, match="distinct"):
        ProblemGenerator(config).generate(101, unique=True)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_digits": 0},
        {"min_digits": 3, "max_digits": 2},
        {"min_operands": 1},
        {"operators": ("^",)},
        {"operators": ()},
        {"heldout_fraction": 0.0},
        {"validation_fraction": -0.1},
        {"heldout_fraction": 0.5, "validation_fraction": 0.5},
        {"kind": "calculus"},
    ],
)
def test_invalid_config(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        GeneratorConfig(**kwargs)  # type: ignore[arg-type]


def test_invalid_level_and_split() -> None:
    with pytest.raises(ConfigError, match="difficulty level"):
        GeneratorConfig.for_level(9)
    with pytest.raises(ConfigError, match="split"):
        ProblemGenerator().generate(1, split="test")  # type: ignore[arg-type]


def test_mixed_kind_produces_both() -> None:
    problems = ProblemGenerator(GeneratorConfig(kind="mixed")).generate(40)
    kinds = {p.metadata["kind"] for p in problems}
    assert kinds == {"arithmetic", "linear"}


def test_batches_are_pure_functions_of_index_and_size() -> None:
    config = GeneratorConfig.for_level(2, seed=5)
    one, other = ProblemGenerator(config), ProblemGenerator(config)
    # batch 3 alone equals batch 3 after other batches; batches differ from each other
    assert other.batch(3, 6) == one.batch(3, 6)
    batches = [one.batch(k, 6) for k in range(4)]
    assert batches[3] == other.batch(3, 6)
    assert len({tuple(p.question for p in b) for b in batches}) == 4
    assert all(len(b) == 6 and all(p.metadata["split"] == "train" for p in b) for b in batches)
    assert all(p.metadata["split"] == "heldout" for p in one.batch(0, 3, split="heldout"))
    assert one.batch(0, 0) == []
    with pytest.raises(ConfigError, match="index"):
        one.batch(-1, 2)
