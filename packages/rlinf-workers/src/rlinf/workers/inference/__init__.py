"""Log-prob recomputation under the actor's old policy or the reference model."""

from rlinf.workers.inference.worker import InferenceConfig, InferenceRole, InferenceWorker

__all__ = ["InferenceConfig", "InferenceRole", "InferenceWorker"]
