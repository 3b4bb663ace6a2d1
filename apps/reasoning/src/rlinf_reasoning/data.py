"""Training batches and the held-out set, as pure functions of (seed, step).

`ProblemSource.batch(position)` returns the problems of the `position`-th training batch
(0-based; step k trains on position k - 1). The same seed always gives the same batch at the
same position, however the batches before it were drawn, so a resumed run reads exactly the
problems the uninterrupted run would have read. The source is also the rollout's
`rlinf.workers.reasoning.ProblemSource` (``source(step, groups)``): the flow hands it to the
rollout ranks, which draw their prompts themselves, so no prompt passes through the driver.

- Generated problems (`data.path` null): the `rlinf.envs.math.ProblemGenerator` train stream
  of `GeneratorConfig.for_level(level, seed=...)`, cut into consecutive batches; the held-out
  set is the first `heldout_size` distinct problems of its held-out stream (disjoint from
  training by construction).
- A file or datasets folder (`data.path`, `read_problems`): problems are split by a hash of
  the question (10% held out), unless `data.heldout_path` names the held-out problems or
  the folder has a test split; training batches walk a fresh seeded permutation of the
  training problems each epoch.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path

from rlinf.envs.math import (
    GeneratorConfig,
    MathProblem,
    ProblemGenerator,
    dataset_splits,
    load_problems,
    split_of,
)
from rlinf_reasoning.config import DataConfig, ReasoningConfig
from rlinf_reasoning.errors import InvalidConfigError

__all__ = ["HELDOUT_FRACTION", "ProblemSource", "read_problems"]

HELDOUT_FRACTION = 0.1
"""Share of a dataset file held out (by question hash) when no held-out file is given."""


def read_problems(cfg: DataConfig) -> tuple[list[MathProblem], list[MathProblem] | None]:
    """The problems of `cfg.path` and the held-out ones when they are given apart: from
    `cfg.heldout_path` (its test split when it is a datasets folder with one), or from
    the test split of a datasets folder at `cfg.path` (None: split `cfg.path` by hash)."""
    assert cfg.path is not None
    path = Path(cfg.path).expanduser()
    problems = load_problems(path, keys=cfg.keys)
    if cfg.heldout_path is not None:
        held = Path(cfg.heldout_path).expanduser()
        split = "test" if "test" in dataset_splits(held) else "train"
        return problems, load_problems(held, keys=cfg.keys, split=split)
    if "test" in dataset_splits(path):
        return problems, load_problems(path, keys=cfg.keys, split="test")
    return problems, None


class ProblemSource:
    """Batches of training problems and the held-out set of one run (module docstring)."""

    def __init__(self, cfg: ReasoningConfig) -> None:
        self._per_step = cfg.data.prompts_per_step
        self._heldout_size = cfg.data.heldout_size
        self._seed = cfg.data_seed
        self._generator: ProblemGenerator | None = None
        self._train: list[MathProblem] = []
        self._heldout: list[MathProblem]
        self._stream: Iterator[MathProblem] | None = None
        self._stream_pos = 0
        self._order: list[int] = []
        self._order_epoch = -1
        if cfg.data.path is None:
            task = GeneratorConfig.for_level(cfg.data.level, seed=self._seed)
            self._generator = ProblemGenerator(task)
            self._heldout = self._generator.generate(self._heldout_size, split="heldout",
                                                     unique=True)
            return
        problems, heldout = read_problems(cfg.data)
        if heldout is not None:
            self._train = problems
            self._heldout = heldout
        else:
            held = [p for p in problems
                    if split_of(p.question, heldout_fraction=HELDOUT_FRACTION) == "heldout"]
            self._train = [p for p in problems
                           if split_of(p.question, heldout_fraction=HELDOUT_FRACTION) == "train"]
            self._heldout = held
        self._heldout = self._heldout[:self._heldout_size]
        if not self._train:
            raise InvalidConfigError("data.path", cfg.data.path,
                                     "a file with at least one training problem")
        if not self._heldout:
            raise InvalidConfigError("data.heldout_path" if cfg.data.heldout_path else "data.path",
                                     cfg.data.heldout_path or cfg.data.path,
                                     "a file with at least one held-out problem")

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
        """Training problems read from files (None: generated on the fly)."""
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
