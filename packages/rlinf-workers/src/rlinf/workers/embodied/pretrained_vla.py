"""A pretrained Hugging Face vision-language model as an OpenVLA-style action policy.

`PretrainedVLA` loads an image-text-to-text checkpoint from a local folder
(`AutoModelForImageTextToText` with its `AutoProcessor`: LLaVA, PaliGemma, Idefics3/SmolVLM,
Qwen2-VL and the like) and decodes one action token per action dimension, as OpenVLA does:
bin k of ``num_bins`` uniform bins over [-1, 1] is token ``tokenizer.vocab_size - 1 - k``, so
the last ``num_bins`` ids of the base vocabulary stand for actions. With ``num_bins=255`` this
is OpenVLA's action tokenizer exactly (its bin centres and its token ids); a checkpoint
fine-tuned that way acts as trained. Only bin tokens are eligible when decoding, so every
sample is a valid action, and the log-probabilities PPO needs are over the bins.

It offers what `TinyVLA` offers (`act`, `value`, `evaluate`, the bin ↔ action maps), so
`VLAActorCritic`, the rollout worker and the actor take either. A value head on the last
prompt position's final hidden state makes it an actor-critic; GRPO ignores it.

Decoding reuses the prefix's key/value cache (one forward pass over image and prompt, then
one token per dimension); `evaluate` is one teacher-forced pass, and both score the same
tokens identically (tested). The model is trained in full: parameter-efficient fine-tuning
of 7B models belongs on a GPU and is not part of this module.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from rlinf.workers.embodied.vla import (
    VLASample,
    action_bins,
    bin_centres,
    sample_action_token,
    score_action_tokens,
)
from rlinf.workers.errors import ConfigError, ShapeError

__all__ = ["OPENVLA_PROMPT", "PretrainedVLA", "PretrainedVLAConfig"]

OPENVLA_PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
"""OpenVLA's prompt; ``{instruction}`` is replaced by the task's instruction (lower-cased)."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class PretrainedVLAConfig:
    """Where the checkpoint is and how it sees the env."""

    path: str
    """Local folder of a Hugging Face image-text-to-text checkpoint with its processor
    (``config.json``, weights, tokenizer and image-processor files); nothing is downloaded."""
    image_shape: tuple[int, int, int]
    """(C, H, W) of the env's uint8 frames (C = 3 per stacked camera); the processor resizes."""
    action_dim: int
    """Action dimensions; one action token each."""
    num_bins: int = 255
    """Uniform bins over [-1, 1] per dimension (255: OpenVLA's)."""
    camera: int = 0
    """Which stacked camera the model sees (channels 3k..3k+2; 0: LIBERO's agent view)."""
    prompt: str = OPENVLA_PROMPT
    """Prompt template with ``{instruction}``; the processor's image token is put in front
    when the template lacks it and the processor has one."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of the loaded model (the value head stays float32)."""
    trust_remote_code: bool = False
    """Allow the checkpoint's own Python code (needed by checkpoints that ship a model class)."""

    def __post_init__(self) -> None:
        channels = self.image_shape[0]
        if len(self.image_shape) != 3 or channels % 3 or min(self.image_shape) < 1:
            raise ConfigError(f"image_shape must be (3k, H, W) of stacked RGB cameras, got "
                              f"{self.image_shape}")
        if not 0 <= self.camera < channels // 3:
            raise ConfigError(f"camera {self.camera} is not one of the {channels // 3} cameras "
                              f"of image_shape {self.image_shape}")
        if min(self.action_dim, self.num_bins) < 1:
            raise ConfigError(f"action_dim and num_bins must be >= 1, got {self.action_dim} and "
                              f"{self.num_bins}")
        if "{instruction}" not in self.prompt:
            raise ConfigError(f"prompt must contain '{{instruction}}', got {self.prompt!r}")
        if self.dtype not in _DTYPES:
            raise ConfigError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")


def _load(config: PretrainedVLAConfig) -> tuple[nn.Module, Any]:
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.utils import logging as hf_logging

    if not os.path.isdir(config.path):
        raise ConfigError(f"pretrained VLA folder {config.path!r} does not exist: give the local "
                          "folder of a Hugging Face image-text-to-text checkpoint (for example "
                          "one saved with save_pretrained or fetched with huggingface-cli "
                          "download)")
    hf_logging.disable_progress_bar()
    try:
        processor = AutoProcessor.from_pretrained(
            config.path, local_files_only=True, trust_remote_code=config.trust_remote_code)
        model = AutoModelForImageTextToText.from_pretrained(
            config.path, local_files_only=True, trust_remote_code=config.trust_remote_code,
            dtype=_DTYPES[config.dtype])
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot load a Hugging Face image-text-to-text model and processor "
                          f"from {config.path!r}: {exc}") from exc
    return model, processor


class PretrainedVLA(nn.Module):
    """A Hugging Face VLM decoding action tokens (see the module docstring)."""

    def __init__(self, config: PretrainedVLAConfig, *, seed: int) -> None:
        super().__init__()
        self.config = config
        self.model, self.processor = _load(config)
        self.tokenizer = self.processor.tokenizer
        self.tokenizer.padding_side = "left"  # every row's prompt ends at the last position
        vocab = int(self.tokenizer.vocab_size)
        if config.num_bins > vocab:
            raise ConfigError(f"num_bins {config.num_bins} exceeds the tokenizer's base "
                              f"vocabulary of {vocab} tokens")
        self.bin_ids: torch.Tensor
        self.register_buffer("bin_ids", vocab - 1 - torch.arange(config.num_bins),
                             persistent=False)
        image_token = getattr(self.processor, "image_token", None)
        self._template = (f"{image_token}{config.prompt}"
                          if image_token and image_token not in config.prompt else config.prompt)
        embeddings: Any = self.model.get_input_embeddings()  # type: ignore[operator]
        hidden = int(embeddings.embedding_dim)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            self.value_head = nn.Linear(hidden, 1)

    def tokens_to_action(self, tokens: torch.Tensor) -> torch.Tensor:
        """Bin centres in [-1, 1] of bin indices."""
        return bin_centres(tokens, self.config.num_bins)

    def action_to_tokens(self, action: torch.Tensor) -> torch.Tensor:
        """Bin index of each (clipped) action value."""
        return action_bins(action, self.config.num_bins)

    def _inputs(self, images: torch.Tensor, instructions: Sequence[str]) -> dict[str, Any]:
        cfg = self.config
        if tuple(images.shape[1:]) != cfg.image_shape or len(instructions) != len(images):
            raise ShapeError(f"expected images [N, *{cfg.image_shape}] and N instructions, got "
                             f"{tuple(images.shape)} and {len(instructions)}")
        frames = images[:, 3 * cfg.camera:3 * cfg.camera + 3]
        if frames.dtype != torch.uint8:
            frames = (frames.float().clamp(0, 1) * 255).round().to(torch.uint8)
        pictures = list(np.ascontiguousarray(frames.permute(0, 2, 3, 1).cpu().numpy()))
        prompts = [self._template.format(instruction=text.lower()) for text in instructions]
        inputs = dict(self.processor(images=pictures, text=prompts, return_tensors="pt",
                                     padding=True))
        device = self.bin_ids.device
        dtype = next(self.model.parameters()).dtype
        return {k: (v.to(device, dtype) if torch.is_floating_point(v) else v.to(device))
                for k, v in inputs.items()}

    def _bin_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits of the bin tokens in bin order, float32."""
        return logits.index_select(-1, self.bin_ids).float()

    def _value(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.value_head(hidden.float()).squeeze(-1)

    @torch.no_grad()
    def act(self, images: torch.Tensor, instructions: Sequence[str], *,
            deterministic: bool = False, generator: torch.Generator | None = None) -> VLASample:
        """Decode one action token per dimension (sampled, or the most likely bin), reusing
        the prefix's key/value cache."""
        inputs = self._inputs(images, instructions)
        out = self.model(**inputs, use_cache=True, output_hidden_states=True)
        value = self._value(out.hidden_states[-1][:, -1])
        mask = inputs["attention_mask"]
        log_prob = torch.zeros(len(images), device=mask.device)
        picked: list[torch.Tensor] = []
        for dim in range(self.config.action_dim):
            token, token_log_prob = sample_action_token(
                self._bin_logits(out.logits[:, -1]), deterministic=deterministic,
                generator=generator)
            log_prob += token_log_prob
            picked.append(token)
            if dim + 1 < self.config.action_dim:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                out = self.model(input_ids=self.bin_ids[token][:, None], attention_mask=mask,
                                 past_key_values=out.past_key_values, use_cache=True)
        tokens = torch.stack(picked, dim=1)
        return VLASample(tokens=tokens, action=self.tokens_to_action(tokens),
                         log_prob=log_prob, value=value)

    def value(self, images: torch.Tensor, instructions: Sequence[str]) -> torch.Tensor:
        """``[N]`` critic estimate of the observations (one pass over the prefix)."""
        out = self.model(**self._inputs(images, instructions), output_hidden_states=True)
        return self._value(out.hidden_states[-1][:, -1])

    def evaluate(self, images: torch.Tensor, instructions: Sequence[str], tokens: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Differentiable ``(log_prob [N], entropy [N], value [N])`` of given action tokens,
        in one teacher-forced pass."""
        inputs = self._inputs(images, instructions)
        prefix_len = inputs["input_ids"].shape[1]
        forced = self.bin_ids[tokens[:, :-1]]
        for key, value in list(inputs.items()):  # per-token inputs go on as the prompt ends
            if key != "input_ids" and value.dim() == 2 and value.shape[1] == prefix_len:
                tail = torch.ones_like(forced) if key == "attention_mask" else (
                    value[:, -1:].expand_as(forced))
                inputs[key] = torch.cat([value, tail], dim=1)
        inputs["input_ids"] = torch.cat([inputs["input_ids"], forced], dim=1)
        out = self.model(**inputs, output_hidden_states=True)
        picked, entropy = score_action_tokens(self._bin_logits(out.logits[:, prefix_len - 1:]),
                                              tokens, action_dim=self.config.action_dim)
        value = self._value(out.hidden_states[-1][:, prefix_len - 1])
        return picked, entropy, value
