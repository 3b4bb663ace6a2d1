"""The run's problems (`problem_source`): training batches and the held-out set as pure
functions of (seed, step) (`rlinf.workers.reasoning.problems.SeededProblems`).

- Generated problems (`data.path` null): `GeneratorConfig.for_level(level, seed=...)`.
- A file or datasets folder (`data.path`, `read_problems`): held out apart when
  `data.heldout_path` names the held-out problems or the folder has a test split, else
  split by a hash of the question.
"""

from __future__ import annotations

from pathlib import Path

from rlinf.envs.math import GeneratorConfig, MathProblem, dataset_splits, load_problems
from rlinf.workers.reasoning.problems import SeededProblems
from rlinf_reasoning.config import DataConfig, ReasoningConfig
from rlinf_reasoning.errors import InvalidConfigError

__all__ = ["problem_source", "read_problems"]


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


def problem_source(cfg: ReasoningConfig) -> SeededProblems:
    """The problems of the run `cfg` configures (module docstring)."""
    data, seed = cfg.data, cfg.data_seed
    if data.path is None:
        return SeededProblems.generated(GeneratorConfig.for_level(data.level, seed=seed),
                                        per_step=data.prompts_per_step,
                                        heldout_size=data.heldout_size)
    source = SeededProblems.from_problems(*read_problems(data), per_step=data.prompts_per_step,
                                          seed=seed, heldout_size=data.heldout_size)
    if not source.train_size:
        raise InvalidConfigError("data.path", data.path,
                                 "a file with at least one training problem")
    if not source.heldout:
        raise InvalidConfigError("data.heldout_path" if data.heldout_path else "data.path",
                                 data.heldout_path or data.path,
                                 "a file with at least one held-out problem")
    return source
