"""Reward functions in the shapes users bring them, combined with weights.

A run's reward is ``sum(weight_i * f_i)`` over its functions, each logged on its own. A
function is named ``module:function`` (``module.sub:Class.attr`` also works) or ``math``, the
built-in math verifier. Its shape is told from its parameter names:

- **per sample**, ``f(response, answer) -> number``: the decoded response and the reference
  answer;
- **TRL's batch shape**, ``f(prompts, completions, **columns) -> list[number]``: the
  group's prompts as the dataset has them, the completions (texts, or
  ``[{"role": "assistant", "content": text}]`` when the prompts are chat messages, as TRL
  passes them), ``ground_truth`` (the reference answers) and every dataset column by its
  name, one value per completion (keyword arguments the function does not accept are not
  passed unless it takes ``**kwargs``); a None score counts as 0;
- **veRL's** ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``,
  used unchanged: ``data_source`` and ``extra_info`` are the dataset's columns of those
  names; a dict result gives its ``"score"``.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rlinf.workers.errors import ConfigError, RewardFunctionError

__all__ = ["BUILTIN_MATH", "RewardSample", "RewardShape", "RewardTerm", "load_reward_function",
           "load_reward_terms", "reward_shape"]

BUILTIN_MATH = "math"
"""The name of the built-in math verifier among a run's reward functions."""

RewardShape = Literal["sample", "batch", "verl"]

_QUOTE = 200  # characters of a sample quoted in an error
_SHAPES = ("f(response, answer) -> number; f(prompts, completions, **columns) -> "
           "list[number] (TRL); or compute_score(data_source, solution_str, ground_truth, "
           "extra_info=None) (veRL)")


@dataclass(frozen=True)
class RewardSample:
    """One response to score, with what reward functions of every shape read."""

    response: str
    """The decoded response."""
    answer: str
    """The reference final answer."""
    prompt: Any = ""
    """The prompt as the dataset has it: text, or chat messages ("" when not carried)."""
    columns: Mapping[str, Any] = field(default_factory=dict)
    """The problem's dataset columns (empty when not carried)."""

    def describe(self, index: int) -> str:
        """The sample, quoted for an error message."""
        return (f"sample {index}: response {self.response[:_QUOTE]!r}, answer "
                f"{self.answer[:_QUOTE]!r}")


def load_reward_function(spec: str) -> Callable[..., Any]:
    """The callable ``module:function`` names (``module.sub:attr.attr`` also works);
    ConfigError saying what is wrong otherwise."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise ConfigError(f"reward function {spec!r} must read 'module:function' (e.g. "
                          f"'my_rewards:exact_match') or be {BUILTIN_MATH!r}")
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"reward function {spec!r}: cannot import {module_name!r} ({exc}); "
                          "put the module on PYTHONPATH of every node") from exc
    except Exception as exc:  # the module's own code failed as it ran
        raise ConfigError(f"reward function {spec!r}: importing {module_name!r} raised "
                          f"{exc!r}") from exc
    for name in attr_path.split("."):
        if not hasattr(target, name):
            raise ConfigError(f"reward function {spec!r}: {module_name!r} has no "
                              f"{attr_path!r}")
        target = getattr(target, name)
    if not callable(target):
        raise ConfigError(f"reward function {spec!r} is a {type(target).__name__}, not a "
                          "function")
    return target


def reward_shape(function: Callable[..., Any], name: str) -> RewardShape:
    """Which of the three shapes (module docstring) `function` has, from its parameters."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature: called per sample
        return "sample"
    if "completions" in parameters:
        return "batch"
    if "solution_str" in parameters and "ground_truth" in parameters:
        return "verl"
    positional = [p for p in parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    takes_more = any(p.kind is p.VAR_POSITIONAL for p in parameters.values())
    if len(required) <= 2 and (len(positional) >= 2 or takes_more):
        return "sample"
    raise ConfigError(f"reward function {name!r} takes {list(parameters)}: expected one of "
                      f"{_SHAPES}")


def _keywords(function: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword arguments `function` accepts (None: any, it takes ``**kwargs`` or has no
    signature); read once, when the function is loaded, not at every call."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return None
    return frozenset(parameters)


@dataclass(frozen=True)
class RewardTerm:
    """One reward function of a run, with its weight."""

    spec: str
    """As configured: ``module:function`` or ``math``."""
    name: str
    """Its metric name: the function's name, or ``module.function`` when two share one."""
    weight: float
    """Its factor in the run's reward."""
    shape: RewardShape
    """How it is called (module docstring)."""
    function: Callable[..., Any]
    """The callable."""
    keywords: frozenset[str] | None = None
    """The keyword arguments it accepts (None: any); the others are not passed."""

    def _call(self, kwargs: dict[str, Any]) -> Any:
        accepted = self.keywords
        return self.function(**(kwargs if accepted is None else
                                {k: v for k, v in kwargs.items() if k in accepted}))

    def score(self, samples: Sequence[RewardSample]) -> list[float]:
        """One finite score per sample; a `RewardFunctionError` naming this function and
        quoting the sample when it raises or returns anything else."""
        if self.shape == "batch":
            return self._batch(samples)
        out = []
        for index, sample in enumerate(samples):
            try:
                if self.shape == "verl":
                    value = self._call({
                        "data_source": sample.columns.get("data_source", ""),
                        "solution_str": sample.response, "ground_truth": sample.answer,
                        "extra_info": sample.columns.get("extra_info")})
                    if isinstance(value, Mapping) and "score" in value:
                        value = value["score"]
                else:
                    value = self.function(sample.response, sample.answer)
            except Exception as exc:
                if self.spec == BUILTIN_MATH or isinstance(exc, RewardFunctionError):
                    raise  # the verifier's own errors say what failed
                raise RewardFunctionError(f"reward function {self.spec!r} raised {exc!r} on "
                                          f"{sample.describe(index)}") from exc
            out.append(self._finite(value, sample, index))
        return out

    def _batch(self, samples: Sequence[RewardSample]) -> list[float]:
        columns: dict[str, list[Any]] = {}
        for sample in samples:
            for key in sample.columns:
                columns.setdefault(key, [])
        for key, values in columns.items():
            values.extend(s.columns.get(key) for s in samples)
        completions = [[{"role": "assistant", "content": s.response}]
                       if isinstance(s.prompt, list) else s.response for s in samples]
        kwargs = {**columns, "prompts": [s.prompt for s in samples],
                  "completions": completions, "ground_truth": [s.answer for s in samples]}
        try:
            values = self._call(kwargs)
        except Exception as exc:
            raise RewardFunctionError(
                f"reward function {self.spec!r} raised {exc!r} on a batch of {len(samples)} "
                f"starting with {samples[0].describe(0) if samples else 'nothing'}") from exc
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or \
                len(values) != len(samples):
            raise RewardFunctionError(
                f"reward function {self.spec!r} returned {str(values)[:_QUOTE]!r}; a batch "
                f"function returns a list of {len(samples)} numbers, one per completion")
        return [0.0 if value is None else self._finite(value, sample, index)
                for index, (value, sample) in enumerate(zip(values, samples, strict=True))]

    def _finite(self, value: Any, sample: RewardSample, index: int) -> float:
        try:
            reward = float(value)
        except (TypeError, ValueError):
            reward = math.nan
        if not math.isfinite(reward):
            raise RewardFunctionError(f"reward function {self.spec!r} returned {value!r}, not "
                                      f"a finite number, on {sample.describe(index)}")
        return reward


def load_reward_terms(specs: Sequence[str], weights: Sequence[float], *,
                      builtin: Callable[[str, str], float]) -> tuple[RewardTerm, ...]:
    """The terms of `specs` (``module:function`` or ``math``, whose callable is `builtin`)
    with `weights` (empty: 1 each); ConfigError for a name that cannot be imported, a
    function of no known shape, or weights that do not match."""
    if not specs:
        raise ConfigError(f"at least one reward function is needed (e.g. {BUILTIN_MATH!r})")
    if weights and len(weights) != len(specs):
        raise ConfigError(f"{len(weights)} reward weights for {len(specs)} functions: give one "
                          "weight per function, or none for 1 each")
    if len(set(specs)) != len(specs):
        raise ConfigError(f"reward functions {list(specs)} name one twice; weight it instead")
    functions = [builtin if spec == BUILTIN_MATH else load_reward_function(spec)
                 for spec in specs]
    short = [BUILTIN_MATH if spec == BUILTIN_MATH else spec.rpartition(".")[2].rpartition(":")[2]
             for spec in specs]
    names = [name if short.count(name) == 1 else spec.replace(":", ".")
             for name, spec in zip(short, specs, strict=True)]
    return tuple(
        RewardTerm(spec=spec, name=name, weight=float(weight), function=function,
                   shape="sample" if spec == BUILTIN_MATH else reward_shape(function, spec),
                   keywords=_keywords(function))
        for spec, name, weight, function in zip(
            specs, names, weights or [1.0] * len(specs), functions, strict=True))
