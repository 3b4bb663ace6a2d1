"""`SeededProblems`: a batch is a pure function of (seed, position), held-out problems never
train, and sizes other than the configured batch read on from where it starts."""

from __future__ import annotations

import pickle

import pytest

from rlinf.envs.math import GeneratorConfig, MathProblem
from rlinf.workers.errors import ConfigError
from rlinf.workers.reasoning.problems import SeededProblems


def _given(n: int) -> list[MathProblem]:
    return [MathProblem(question=f"{i}+1", answer=str(i + 1)) for i in range(n)]


def test_given_problems_split_by_hash_and_batches_depend_only_on_seed_and_position() -> None:
    source = SeededProblems.from_problems(_given(300), None, per_step=8, seed=3,
                                          heldout_size=1000)
    assert source.train_size is not None and source.train_size + len(source.heldout) == 300
    assert not {p.question for p in source.heldout} & {
        p.question for k in range(40) for p in source.batch(k)}
    again = SeededProblems.from_problems(_given(300), None, per_step=8, seed=3,
                                         heldout_size=1000)
    assert again.batch(37) == source.batch(37)  # without reading batches 0..36 first
    other = SeededProblems.from_problems(_given(300), None, per_step=8, seed=4,
                                         heldout_size=1000)
    assert other.batch(0) != source.batch(0)


def test_held_out_apart_keeps_every_given_problem_for_training_and_caps_the_held_out() -> None:
    source = SeededProblems.from_problems(_given(20), _given(5), per_step=4, seed=0,
                                          heldout_size=3)
    assert source.train_size == 20 and len(source.heldout) == 3


def test_generated_batches_survive_pickling_and_other_sizes_read_on() -> None:
    source = SeededProblems.generated(GeneratorConfig.for_level(1, seed=5), per_step=4,
                                      heldout_size=10)
    assert source.train_size is None and len(source.heldout) == 10
    first, second = source.batch(0), source.batch(1)
    assert source(1, 4) == first and source(0, 4) == first  # step 0, a warm-up
    assert source(1, 6) == [*first, *second[:2]]
    shipped = pickle.loads(pickle.dumps(source))
    assert shipped.batch(1) == second


def test_no_training_problems_is_an_error_that_says_so() -> None:
    with pytest.raises(ConfigError, match="no training problems"):
        SeededProblems(per_step=2, seed=0, heldout=_given(1)).batch(0)
