"""Rollout: engine-agnostic generation (HF, vLLM, SGLang) and the streaming rollout worker."""

from rlinf.workers.rollout.batch import RolloutBatch
from rlinf.workers.rollout.hf_engine import HFRolloutEngine
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
from rlinf.workers.rollout.worker import GroupSink, RolloutStats, RolloutWorker, RolloutWorkerConfig

__all__ = [
    "FinishReason",
    "GroupSink",
    "HFRolloutEngine",
    "NamedTensors",
    "RolloutBatch",
    "RolloutEngine",
    "RolloutError",
    "RolloutSample",
    "RolloutStats",
    "RolloutWorker",
    "RolloutWorkerConfig",
    "SamplingConfig",
    "SglangRolloutEngine",
    "VllmRolloutEngine",
]
