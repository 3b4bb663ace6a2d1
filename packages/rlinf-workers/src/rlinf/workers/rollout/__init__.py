"""Rollout: engine-agnostic generation (HF, vLLM, SGLang) and the streaming rollout worker.

The HF engine and the rollout worker need transformers, which a process that only reads the
types (weight sync in an embodied flow's workers) does not: their names are imported on
first use (`rlinf.workers._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlinf.workers._lazy import lazy_attribute
from rlinf.workers.rollout.batch import RolloutBatch
from rlinf.workers.rollout.sglang_engine import SglangRolloutEngine
from rlinf.workers.rollout.types import (
    FinishReason,
    NamedTensors,
    RolloutEngine,
    RolloutError,
    RolloutSample,
    SamplingConfig,
)
from rlinf.workers.rollout.vllm_engine import VllmRolloutEngine

if TYPE_CHECKING:
    from rlinf.workers.rollout.hf_engine import HFRolloutEngine
    from rlinf.workers.rollout.worker import (
        GroupSink,
        RolloutGenerator,
        RolloutGeneratorConfig,
        RolloutStats,
    )

_LAZY = {"HFRolloutEngine": "hf_engine", "GroupSink": "worker", "RolloutStats": "worker",
         "RolloutGenerator": "worker", "RolloutGeneratorConfig": "worker"}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name)


__all__ = [
    "FinishReason",
    "GroupSink",
    "HFRolloutEngine",
    "NamedTensors",
    "RolloutBatch",
    "RolloutEngine",
    "RolloutError",
    "RolloutGenerator",
    "RolloutGeneratorConfig",
    "RolloutSample",
    "RolloutStats",
    "SamplingConfig",
    "SglangRolloutEngine",
    "VllmRolloutEngine",
]
