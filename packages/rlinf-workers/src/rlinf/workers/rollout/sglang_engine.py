"""Rollout with SGLang's offline `Engine` (GPU only; ``rlinf-workers[sglang]``).

SGLang runs its scheduler in a subprocess; `Engine.generate` takes token ids
(``input_ids``) and returns per request ``output_ids`` and, with ``return_logprob``,
``meta_info["output_token_logprobs"]`` as ``(logprob, token_id, text)`` triples. Weights
come in through ``update_weights_from_tensor`` (tensors are shared with the scheduler by
CUDA IPC, so they must live on the GPU); ``release_memory_occupation`` and
``resume_memory_occupation`` (engine built with ``enable_memory_saver``) free and restore
weights and KV cache for collocated time-sharing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog
import torch

from rlinf.workers._extras import require
from rlinf.workers.errors import ConfigError
from rlinf.workers.rollout.types import (
    FinishReason,
    NamedTensors,
    RolloutError,
    RolloutSample,
    SamplingConfig,
    ends_with_stop_sequence,
)

__all__ = ["SglangRolloutEngine"]

_log = structlog.get_logger(__name__)


class SglangRolloutEngine:
    """`RolloutEngine` over ``sglang.Engine`` (see the module docstring)."""

    def __init__(
        self, model_path: str, *, dtype: str = "float32", seed: int = 0,
        mem_fraction_static: float = 0.3, enable_memory_saver: bool = True,
        **engine_kwargs: Any,
    ) -> None:
        """Launch an engine for the Hugging Face checkpoint at `model_path` (needs a GPU)."""
        if not torch.cuda.is_available():
            raise RolloutError("SglangRolloutEngine needs a CUDA GPU (SGLang does not run on "
                               "CPU); use HFRolloutEngine or VllmRolloutEngine there")
        sglang = require("sglang", feature="SglangRolloutEngine", extra="sglang")
        self.enable_memory_saver = enable_memory_saver
        self.engine = sglang.Engine(
            model_path=model_path, dtype=dtype, random_seed=seed,
            mem_fraction_static=mem_fraction_static, enable_memory_saver=enable_memory_saver,
            skip_tokenizer_init=True, **engine_kwargs)
        self._released = False

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], *, sampling: SamplingConfig
    ) -> list[RolloutSample]:
        """One sample per prompt (see `RolloutEngine.generate`)."""
        if self._released:
            raise RolloutError("generate on an offloaded SGLang engine; call onload() first")
        if not prompt_token_ids:
            return []
        params: dict[str, Any] = {
            "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "max_new_tokens": sampling.max_new_tokens,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        if sampling.stop_sequences:
            if any(len(seq) > 1 for seq in sampling.stop_sequences):
                raise ConfigError(
                    "the SGLang engine stops on single tokens (a chat model's tool tags such as "
                    "</tool_call> are one special token each); this stop sequence spans "
                    "several: use the hf or vllm engine, or a tokenizer with the tag as a token")
            params["stop_token_ids"] = sorted({seq[0] for seq in sampling.stop_sequences})
        outputs = self.engine.generate(input_ids=[list(p) for p in prompt_token_ids],
                                       sampling_params=params, return_logprob=True)
        samples = []
        for prompt, out in zip(prompt_token_ids, outputs, strict=True):
            meta = out["meta_info"]
            triples = meta["output_token_logprobs"]
            tokens = tuple(int(t[1]) for t in triples)
            finish = meta.get("finish_reason") or {}
            samples.append(RolloutSample(
                prompt_token_ids=tuple(prompt), response_token_ids=tokens,
                log_probs=tuple(float(t[0]) for t in triples),
                finish_reason=_finish_reason(finish, tokens, sampling)))
        return samples

    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Send a bucket of tensors to the scheduler (CUDA IPC) and flush the KV cache."""
        if self._released:
            raise RolloutError("update_weights on an offloaded SGLang engine; call onload()")
        weights = [(name, t.detach().cuda()) for name, t in named_tensors]
        if not weights:
            raise ConfigError("update_weights got no tensors")
        result = self.engine.update_weights_from_tensor(weights, flush_cache=True)
        ok = result[0] if isinstance(result, tuple) else getattr(result, "success", True)
        if not ok:
            raise RolloutError(f"SGLang rejected the weight update: {result}")

    def offload(self) -> None:
        """Release weights and KV cache on the GPU (needs ``enable_memory_saver``)."""
        if self.enable_memory_saver and not self._released:
            self.engine.release_memory_occupation()
            self._released = True

    def onload(self) -> None:
        """Re-allocate weights and KV cache; weights must then be synced again."""
        if self._released:
            self.engine.resume_memory_occupation()
            self._released = False

    def shutdown(self) -> None:
        """Stop the scheduler subprocesses."""
        self.engine.shutdown()


def _finish_reason(finish: dict[str, Any], tokens: tuple[int, ...],
                   sampling: SamplingConfig) -> FinishReason:
    if finish.get("type") == "length":
        return "length"
    if ends_with_stop_sequence(tokens, sampling.stop_sequences):
        return "stop_sequence"
    return "stop"
