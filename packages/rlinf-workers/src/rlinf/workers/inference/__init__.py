"""Log-prob recomputation under the actor's old policy or the reference model."""

from rlinf.workers.inference.worker import InferenceConfig, InferenceRole, LogProbEngine

__all__ = ["InferenceConfig", "InferenceRole", "LogProbEngine"]
