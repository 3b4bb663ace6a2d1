"""`SeededProblems`: training batches and a held-out set, as pure functions of (seed, step).

`batch(position)` returns the problems of the `position`-th training batch (0-based; step k
trains on position k - 1). The same seed always gives the same batch at the same position,
however the batches before it were drawn, so a resumed run reads exactly the problems the
uninterrupted run would have read. A source is also the rollout's `ProblemSource`
(``source(step, groups)``): the flow hands it to the rollout ranks, which draw their prompts
themselves, so no prompt passes through the driver.

- Generated (`generated`): the `rlinf.envs.math.ProblemGenerator` train stream cut into
  consecutive batches; the held-out set is the first `heldout_size` distinct problems of
  its held-out stream (disjoint from training by construction).
- Given (`from_problems`): problems are split by a hash of the question (`HELDOUT_FRACTION`
  held out) unless the held-out ones come apart; training batches walk a fresh seeded
  permutation of the training problems each epoch.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence

from rlinf.envs.math import GeneratorConfig, MathProblem, ProblemGenerator, split_of
from rlinf.workers.errors import ConfigError

__all__ = ["HELDOUT_FRACTION", "SeededProblems"]

HELDOUT_FRACTION = 0.1
"""Share of given problems held out (by question hash) when no held-out set comes apart."""


class SeededProblems:
    """Batches of training problems and the held-out set of one run (module docstring)."""

    def __init__(self, *, per_step: int, seed: int, heldout: Sequence[MathProblem],
                 generator: ProblemGenerator | None = None,
                 train: Sequence[MathProblem] = ()) -> None:
        if per_step < 1:
            raise ConfigError(f"per_step must be >= 1, got {per_step}")
        self._per_step = per_step
        self._seed = seed
        self._generator = generator
        self._train = list(train)
        self._heldout = list(heldout)
        self._stream: Iterator[MathProblem] | None = None
        self._stream_pos = 0
        self._order: list[int] = []
        self._order_epoch = -1

    @classmethod
    def generated(cls, task: GeneratorConfig, *, per_step: int,
                  heldout_size: int) -> SeededProblems:
        """Problems of `task`'s generator (its seed seeds the batches)."""
        generator = ProblemGenerator(task)
        return cls(per_step=per_step, seed=task.seed, generator=generator,
                   heldout=generator.generate(heldout_size, split="heldout", unique=True))

    @classmethod
    def from_problems(cls, problems: Sequence[MathProblem],
                      heldout: Sequence[MathProblem] | None, *, per_step: int, seed: int,
                      heldout_size: int) -> SeededProblems:
        """`problems` to train on, held out apart (`heldout`) or by question hash (None)."""
        if heldout is None:
            split = [split_of(p.question, heldout_fraction=HELDOUT_FRACTION) for p in problems]
            heldout = [p for p, s in zip(problems, split, strict=True) if s == "heldout"]
            problems = [p for p, s in zip(problems, split, strict=True) if s == "train"]
        return cls(per_step=per_step, seed=seed, train=problems,
                   heldout=list(heldout)[:heldout_size])

    def __call__(self, step: int, groups: int) -> list[MathProblem]:
        """The `groups` problems of iteration `step` (1-based; step 0, a warm-up, reads the
        first batch): `batch(step - 1)` when `groups` is the configured batch, otherwise
        `groups` consecutive problems from where that batch starts (profiling sizes)."""
        position = max(step - 1, 0)
        if groups == self._per_step:
            return self.batch(position)
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        out: list[MathProblem] = []
        while len(out) < groups:
            out.extend(self.batch(position))
            position += 1
        return out[:groups]

    def __getstate__(self) -> dict[str, object]:
        # The generator stream cannot be pickled (the source travels to the rollout ranks);
        # it is a cache that `batch` rebuilds.
        return {**self.__dict__, "_stream": None, "_stream_pos": 0}

    @property
    def train_size(self) -> int | None:
        """Training problems given (None: generated on the fly)."""
        return None if self._generator is not None else len(self._train)

    @property
    def heldout(self) -> list[MathProblem]:
        """The held-out problems greedy accuracy is measured on."""
        return list(self._heldout)

    def batch(self, position: int) -> list[MathProblem]:
        """The problems of training batch `position` (0-based), a pure function of it."""
        if position < 0:
            raise ValueError(f"batch position must be >= 0, got {position}")
        start = position * self._per_step
        if self._generator is None:
            if not self._train:
                raise ConfigError("no training problems were given")
            return [self._train_item(i) for i in range(start, start + self._per_step)]
        if self._stream is None or self._stream_pos > start:
            self._stream = self._generator.stream(split="train")
            self._stream_pos = 0
        skipped = start - self._stream_pos
        batch = list(itertools.islice(self._stream, skipped, skipped + self._per_step))
        self._stream_pos = start + self._per_step
        return batch

    def _train_item(self, index: int) -> MathProblem:
        size = len(self._train)
        epoch, offset = divmod(index, size)
        if self._order_epoch != epoch:
            self._order = list(range(size))
            random.Random(f"rlinf-reasoning:{self._seed}:{epoch}").shuffle(self._order)
            self._order_epoch = epoch
        return self._train[self._order[offset]]
