"""Rollout with Hugging Face `generate`: the embedded default engine, CPU or GPU.

All prompts of a call are generated in one batch, left-padded, under ``torch.no_grad``.
The sampled tokens' log-probs come from the raw logits `generate` already computed at each
step (``output_logits``; before any logits processor), scaled by the temperature and
normalised with the same `token_log_probs` the inference and actor workers use — so no
second forward pass over the responses is needed (at 20M parameters that pass cost a third
of the rollout). They are log-probs of the temperature-scaled *full* distribution;
top-p/top-k only restrict which tokens can be drawn. In fp32 they agree with
`response_log_probs` on the same weights up to the float noise of cached vs. uncached
attention (~1e-6), so the off-policy ratio of the first PPO step is 1 up to that noise.

With ``precision="bf16"`` the engine serves bfloat16 weights, as vLLM and SGLang do with
``dtype="bfloat16"``: its floating-point parameters are cast in place (buffers such as the
rotary frequencies stay as built) and generation runs without autocast. On CPU (AMX) that
generated 64 rows x 32 tokens of a 6M-parameter model quicker than autocast over fp32
weights, which casts the activations around every matmul (and, under
``inference_mode``, every weight at every token: autocast caches no cast there). Its
log-probs then differ from the trainer's bf16 autocast by 0.003 on average (0.016 at most;
autocast-generated ones by 0.0015): the rollout-trainer mismatch of a bf16 engine, which
the rollout correction (`rollout_correction_cap`) or a recompute of the old log-probs
accounts for.

On CPU a model with transformers' ``sdpa`` generates with `rlinf.workers.models.GQA_SDPA`:
the grouped key and value heads are read in place rather than copied per query head at
every step (the same numbers).

Keeping every step's logits costs ``batch x max_new_tokens x vocab`` floats: fine for tiny
vocabularies, 19 GB for 512 x 64 tokens of a 150k vocabulary. Above `logits_budget_bytes`
the engine does not keep them and recomputes the log-probs with `response_log_probs` in one
extra forward pass (memory bounded by its micro-batch) instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import torch
from torch import nn

from rlinf.workers.errors import ConfigError
from rlinf.workers.models import (
    Precision,
    attention_kernel,
    check_precision,
    generation_attention,
    response_log_probs,
    response_mask_from_eos,
    token_log_probs,
)
from rlinf.workers.rollout.batch import left_pad
from rlinf.workers.rollout.offload import (
    OffloadPolicy,
    discard_module,
    empty_device_cache,
    materialize_module,
    move_module,
)
from rlinf.workers.rollout.types import (
    FinishReason,
    NamedTensors,
    RolloutError,
    RolloutSample,
    SamplingConfig,
    ends_with_stop_sequence,
)

__all__ = ["HFRolloutEngine"]

_log = structlog.get_logger(__name__)


class HFRolloutEngine:
    """`RolloutEngine` over a transformers causal LM (see the module docstring)."""

    def __init__(
        self, model: nn.Module, *, eos_token_id: int, pad_token_id: int,
        device: torch.device | str | None = None, offload_policy: OffloadPolicy | None = None,
        logits_budget_bytes: int = 1 << 30, precision: Precision = "fp32",
    ) -> None:
        """Serve `model` on `device` (default: where its parameters are).

        `offload_policy` defaults to ``host`` on CUDA (weights wait in CPU memory) and
        ``discard`` on CPU, where keeping a "host copy" would free nothing: after a
        discarding offload the engine refuses to generate until `update_weights` has
        supplied every parameter again. `logits_budget_bytes` bounds the per-step logits a
        call may keep for its log-probs (see the module docstring). `precision` "bf16"
        casts `model`'s floating-point parameters to bfloat16 in place (see the module
        docstring); weight updates are cast on copy.
        """
        self.precision = check_precision(precision)
        if logits_budget_bytes < 0:
            raise ConfigError(f"logits_budget_bytes must be >= 0, got {logits_budget_bytes}")
        self.logits_budget_bytes = logits_budget_bytes
        self.model = model
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.device = torch.device(device) if device is not None else next(
            model.parameters()).device
        if offload_policy not in (None, "host", "discard"):
            raise ConfigError(f"offload_policy must be 'host' or 'discard', got {offload_policy!r}")
        self.offload_policy: OffloadPolicy = offload_policy or (
            "host" if self.device.type == "cuda" else "discard")
        move_module(model, self.device)
        if self.precision == "bf16":
            _to_bf16_parameters(model)
        model.eval()
        self._targets = dict(model.state_dict(keep_vars=True))
        self._missing: set[int] = set()  # ids of parameters whose values were discarded
        self._offloaded = False
        self._kept: _KeptContexts | None = None

    # -- generation ------------------------------------------------------------------------

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], *, sampling: SamplingConfig,
        keep_cache: bool = False,
    ) -> list[RolloutSample]:
        """One sample per prompt (see `RolloutEngine.generate`). With `keep_cache` the
        contexts and their KV cache stay for `continue_generation` (dropped by the next
        call without it, or `drop_cache`)."""
        self._check_ready()
        self._kept = None
        if not prompt_token_ids:
            return []
        if any(len(p) == 0 for p in prompt_token_ids):
            raise ConfigError("every prompt needs at least one token")
        prompt_ids, prompt_mask = left_pad(prompt_token_ids, pad_id=self.pad_token_id)
        return self._generate(prompt_ids, prompt_mask, sampling=sampling,
                              keep_cache=keep_cache, contexts=prompt_token_ids)

    def continue_generation(
        self, rows: Sequence[int], appended: Sequence[Sequence[int]], *,
        sampling: SamplingConfig, keep_cache: bool = False,
    ) -> list[RolloutSample]:
        """Generate on from the contexts the last call kept (``keep_cache=True``): rows
        `rows` of that call, each with its `appended` tokens (a tool's answer) after what it
        generated, reusing their KV cache, so only the appended tokens are computed before
        sampling. The padding a row accumulated (left of its prompt, after a response that
        ended early, left of its appended tokens) is masked; positions follow the real
        tokens, so the result is the one the whole context would give. A sample's
        ``prompt_token_ids`` is its whole context."""
        self._check_ready()
        kept, self._kept = self._kept, None
        if kept is None:
            raise RolloutError("continue_generation needs a previous call with keep_cache=True "
                               "(none kept, or it was used or dropped)")
        if len(rows) != len(appended) or not rows:
            raise ConfigError(f"continue_generation needs one appended sequence per row, got "
                              f"{len(rows)} rows and {len(appended)} sequences")
        if any(len(a) == 0 for a in appended):
            raise ConfigError("every continued row needs at least one appended token")
        index = torch.tensor(list(rows), dtype=torch.long, device=kept.ids.device)
        kept.cache.batch_select_indices(index)
        extra_ids, extra_mask = left_pad(appended, pad_id=self.pad_token_id)
        ids = torch.cat([kept.ids[index], extra_ids.to(kept.ids.device)], dim=1)
        mask = torch.cat([kept.mask[index], extra_mask.to(kept.mask.device)], dim=1)
        return self._generate(ids, mask, sampling=sampling, keep_cache=keep_cache,
                              cache=kept.cache)

    def drop_cache(self) -> None:
        """Free what `keep_cache` kept."""
        self._kept = None

    def _generate(self, context_ids: torch.Tensor, context_mask: torch.Tensor, *,
                  sampling: SamplingConfig, keep_cache: bool, cache: Any = None,
                  contexts: Sequence[Sequence[int]] | None = None) -> list[RolloutSample]:
        """Sample from ``[B, W]`` contexts (padding masked anywhere; the last column real);
        `cache` holds the KV of all but the last column (a kept call's). `contexts`: the
        real tokens of each row when the caller has them (else read from the mask)."""
        context_ids, context_mask = context_ids.to(self.device), context_mask.to(self.device)
        options: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens, "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id, "do_sample": not sampling.greedy,
        }
        if not sampling.greedy:
            # top_k=0 must be passed explicitly: None would fall back to HF's default of 50.
            options.update(temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                           top_k=sampling.top_k)
        stops = _StopSequences(sampling.stop_sequences, prompt_width=context_ids.shape[1])
        if sampling.stop_sequences:
            options["stopping_criteria"] = [stops]
        if cache is not None:
            options["past_key_values"] = cache
        rows_count = context_ids.shape[0]
        devices = [self.device] if self.device.type == "cuda" else []
        kernel = generation_attention(self.model, device=self.device)
        with torch.no_grad(), attention_kernel(self.model, kernel), \
                torch.random.fork_rng(devices=devices, enabled=sampling.seed is not None):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            vocab = int(getattr(getattr(self.model, "config", None), "vocab_size", 0) or 0)
            keep = 4 * rows_count * sampling.max_new_tokens * vocab
            keep_logits = 0 < keep <= self.logits_budget_bytes
            out = self.model.generate(  # type: ignore[operator]
                input_ids=context_ids, attention_mask=context_mask,
                return_dict_in_generate=True, output_logits=keep_logits, **options)
            response_ids = out.sequences[:, context_ids.shape[1]:]
            response_mask = stops.cut(
                response_mask_from_eos(response_ids, eos_token_id=self.eos_token_id))
            if keep_logits:
                # One [B, V] tensor of raw logits per generated position.
                logits = torch.stack(out.logits, dim=1).float() / sampling.logprob_temperature
                log_probs = token_log_probs(logits, response_ids) * response_mask
            else:
                log_probs = response_log_probs(
                    self.model, prompt_ids=context_ids, prompt_mask=context_mask,
                    response_ids=response_ids, response_mask=response_mask,
                    temperature=sampling.logprob_temperature, micro_batch_size=64)
            if keep_cache and getattr(out, "past_key_values", None) is not None:
                self._kept = _KeptContexts(
                    ids=out.sequences, mask=torch.cat([context_mask, response_mask], dim=1),
                    cache=out.past_key_values)
            lengths = response_mask.sum(dim=1).tolist()
            rows = response_ids.tolist()
            values = log_probs.tolist()
            if contexts is None:
                contexts = [[t for t, m in zip(ids_row, mask_row, strict=True) if m]
                            for ids_row, mask_row in zip(context_ids.tolist(),
                                                         context_mask.tolist(), strict=True)]
        samples = []
        for context, length, tokens, row_log_probs in zip(
                contexts, lengths, rows, values, strict=True):
            kept = tokens[:length]
            reason: FinishReason = "length"
            if length > 0 and kept[-1] == self.eos_token_id:
                reason = "stop"
            elif ends_with_stop_sequence(kept, sampling.stop_sequences):
                reason = "stop_sequence"
            samples.append(RolloutSample(
                prompt_token_ids=tuple(context), response_token_ids=tuple(kept),
                log_probs=tuple(row_log_probs[:length]), finish_reason=reason))
        return samples

    # -- weights ---------------------------------------------------------------------------

    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Copy tensors into the parameters of the same names (a bucket or all of them)."""
        if self._offloaded:
            raise RolloutError("update_weights on an offloaded engine; call onload() first")
        self._kept = None  # a kept cache was computed with the old weights
        with torch.no_grad():
            for name, tensor in named_tensors:
                target = self._targets.get(name)
                if target is None:
                    raise RolloutError(f"unknown parameter {name!r}; the model has e.g. "
                                       f"{sorted(self._targets)[:3]}")
                if tuple(target.shape) != tuple(tensor.shape):
                    raise RolloutError(f"parameter {name!r} is {tuple(target.shape)}, the "
                                       f"update is {tuple(tensor.shape)}")
                target.copy_(tensor.to(target.device, non_blocking=True))
                self._missing.discard(id(target))

    # -- offload / onload ------------------------------------------------------------------

    def offload(self) -> None:
        """Free the engine's memory per `offload_policy` (see `rlinf.workers.rollout.offload`)."""
        if self._offloaded:
            return
        self._kept = None
        if self.offload_policy == "discard":
            freed = discard_module(self.model)
            self._missing = {id(p) for p in self.model.parameters()}
        else:
            freed = sum(p.numel() * p.element_size() for p in self.model.parameters())
            move_module(self.model, "cpu")
        empty_device_cache(self.device)
        self._offloaded = True
        _log.info("rollout_offloaded", policy=self.offload_policy, bytes=freed)

    def onload(self) -> None:
        """Undo `offload`; after a discarding one, weights must be reloaded before generating."""
        if not self._offloaded:
            return
        if self.offload_policy == "discard":
            materialize_module(self.model)
        else:
            move_module(self.model, self.device)
        self._targets = dict(self.model.state_dict(keep_vars=True))
        self._offloaded = False

    @property
    def needs_weights(self) -> bool:
        """True while some parameter lost its value to a discarding offload."""
        return bool(self._missing)

    def _check_ready(self) -> None:
        if self._offloaded:
            raise RolloutError("generate on an offloaded engine; call onload() first")
        if self._missing:
            raise RolloutError(f"{len(self._missing)} parameters were discarded by offload() "
                               "and not reloaded; sync weights before generating")


def _to_bf16_parameters(model: nn.Module) -> None:
    """Cast `model`'s floating-point parameters to bfloat16 in place (the Parameter objects
    stay, so references to them remain valid); buffers keep their dtype."""
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point() and param.dtype != torch.bfloat16:
                param.data = param.data.to(torch.bfloat16)


@dataclass
class _KeptContexts:
    """A call's contexts for `HFRolloutEngine.continue_generation`."""

    ids: torch.Tensor
    """``[B, W]`` every token so far, padding included."""
    mask: torch.Tensor
    """``[B, W]`` 1 on real tokens."""
    cache: Any
    """The model's KV cache of ``ids[:, :-1]``."""


class _StopSequences:
    """A `generate` stopping criterion: a row is done once its response ends with one of
    `sequences` (token ids); `cut` then ends its response mask there (`generate` pads a
    finished row with pad tokens, which the EOS-based mask would count)."""

    def __init__(self, sequences: Sequence[Sequence[int]], *, prompt_width: int) -> None:
        self.sequences = [torch.tensor(list(seq), dtype=torch.long) for seq in sequences]
        self.prompt_width = prompt_width
        self.ends: torch.Tensor | None = None  # [B] response length at the stop, -1: none

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor,
                 **kwargs: Any) -> torch.Tensor:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for seq in self.sequences:
            if input_ids.shape[1] - self.prompt_width >= len(seq):
                tail = input_ids[:, -len(seq):]
                done |= (tail == seq.to(input_ids.device)).all(dim=1)
        if self.ends is None:
            self.ends = torch.full_like(done, -1, dtype=torch.long)
        first = done & (self.ends < 0)
        self.ends[first] = input_ids.shape[1] - self.prompt_width
        return done

    def cut(self, response_mask: torch.Tensor) -> torch.Tensor:
        """`response_mask` with every row that hit a stop sequence ending at it."""
        if self.ends is None or not bool((self.ends >= 0).any()):
            return response_mask
        ends = self.ends.to(response_mask.device)
        positions = torch.arange(response_mask.shape[1], device=response_mask.device)
        keep = (ends < 0).unsqueeze(1) | (positions.unsqueeze(0) < ends.unsqueeze(1))
        return response_mask * keep.to(response_mask.dtype)
