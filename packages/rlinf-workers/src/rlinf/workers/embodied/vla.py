"""A tiny vision-language-action policy in the style of OpenVLA, built from a config.

Image patches (linear patch embedding) and the instruction's tokens form the prefix of a
tiny Qwen2 decoder (`models.build_tiny_causal_lm`, no download); the action is decoded as
`action_dim` tokens, one per dimension, from `num_bins` extra vocabulary entries that
discretise [-1, 1] uniformly (OpenVLA uses 256 bins over each dimension's range). Only the
bin tokens are eligible when decoding, so every sample is a valid action. A value head on the
prefix's last hidden state makes it an actor-critic for PPO; GRPO ignores it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rlinf.workers.errors import ConfigError, ShapeError
from rlinf.workers.models.logprobs import position_ids_from_mask

__all__ = ["TinyVLA", "VLAConfig", "VLASample", "action_bins", "bin_centres", "sample_action_token",
           "score_action_tokens"]


@dataclass(frozen=True)
class VLAConfig:
    """Shape of a tiny VLA."""

    image_shape: tuple[int, int, int]
    """(C, H, W) of the uint8 camera image; H and W divisible by `patch_size`."""
    action_dim: int
    """Action dimensions; one action token each."""
    num_bins: int = 32
    """Uniform bins over [-1, 1] per dimension (the extra vocabulary)."""
    patch_size: int = 8
    """Side of the square image patches."""
    max_instruction_tokens: int = 32
    """Instructions are left-padded or truncated to this many tokens."""
    hidden_size: int = 64
    """Width of the decoder."""
    num_layers: int = 2
    """Decoder layers."""
    num_heads: int = 4
    """Attention heads (2 key/value heads)."""

    def __post_init__(self) -> None:
        _, height, width = self.image_shape
        if height % self.patch_size or width % self.patch_size:
            raise ConfigError(f"patch_size {self.patch_size} must divide the image's height "
                              f"and width, got {self.image_shape}")
        if min(self.action_dim, self.num_bins, self.max_instruction_tokens) < 1:
            raise ConfigError(f"action_dim, num_bins and max_instruction_tokens must be >= 1, "
                              f"got {self}")


@dataclass(frozen=True)
class VLASample:
    """What `TinyVLA.act` returns, one row per observation."""

    tokens: torch.Tensor
    """``[N, action_dim]`` bin indices (0..num_bins-1)."""
    action: torch.Tensor
    """``[N, action_dim]`` bin centres in [-1, 1]."""
    log_prob: torch.Tensor
    """``[N]`` sum of the action tokens' log-probabilities."""
    value: torch.Tensor
    """``[N]`` critic estimate of the observation."""


def bin_centres(tokens: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Centres in [-1, 1] of bin indices, `num_bins` uniform bins."""
    return -1.0 + (2.0 * tokens.float() + 1.0) / num_bins


def action_bins(action: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Bin index of each (clipped) action value in [-1, 1]."""
    scaled = (action.clamp(-1.0, 1.0) + 1.0) / 2.0 * num_bins
    return scaled.long().clamp(max=num_bins - 1)


def sample_action_token(bin_logits: torch.Tensor, *, deterministic: bool,
                        generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token [N], log_prob [N])``: a bin drawn from the logits ``[N, bins]`` of the next
    action token (the most likely one when `deterministic`), and its log-probability."""
    log_p = torch.log_softmax(bin_logits, dim=-1)
    token = (log_p.argmax(-1) if deterministic else
             torch.multinomial(log_p.exp(), 1, generator=generator).squeeze(-1))
    return token, log_p.gather(-1, token[:, None]).squeeze(-1)


def score_action_tokens(bin_logits: torch.Tensor, tokens: torch.Tensor, *, action_dim: int
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_prob [N], entropy [N])`` of action `tokens` ``[N, action_dim]`` under the bin
    logits ``[N, action_dim, bins]`` of one teacher-forced pass (summed over dimensions)."""
    if tuple(tokens.shape) != (len(bin_logits), action_dim):
        raise ShapeError(f"expected tokens [N, {action_dim}], got {tuple(tokens.shape)}")
    log_p = torch.log_softmax(bin_logits, dim=-1)
    picked = log_p.gather(-1, tokens[..., None]).squeeze(-1).sum(-1)
    entropy = -(log_p.exp() * log_p).sum(-1).sum(-1)
    return picked, entropy


class TinyVLA(nn.Module):
    """Image + instruction → discretised action tokens (see the module docstring)."""

    def __init__(self, config: VLAConfig, *, seed: int) -> None:
        # transformers is imported here, not with the module: every embodied actor process
        # imports this module, and only a VLA run needs it (seconds of CPU per process).
        from rlinf.workers.models.causal_lm import TinyLMConfig, build_tiny_causal_lm
        from rlinf.workers.models.tokenizer import build_char_tokenizer

        super().__init__()
        self.config = config
        self.tokenizer = build_char_tokenizer()
        self.bin_offset = len(self.tokenizer)  # bin k is token bin_offset + k
        channels, height, width = config.image_shape
        self.num_patches = (height // config.patch_size) * (width // config.patch_size)
        length = self.num_patches + config.max_instruction_tokens + config.action_dim
        self.lm = build_tiny_causal_lm(TinyLMConfig(
            vocab_size=self.bin_offset + config.num_bins, hidden_size=config.hidden_size,
            num_layers=config.num_layers, num_heads=config.num_heads, num_kv_heads=2,
            intermediate_size=2 * config.hidden_size, max_position_embeddings=length,
            tie_word_embeddings=False), seed=seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            self.patch_embed = nn.Linear(channels * config.patch_size ** 2, config.hidden_size)
            self.value_head = nn.Linear(config.hidden_size, 1)

    def tokens_to_action(self, tokens: torch.Tensor) -> torch.Tensor:
        """Bin centres in [-1, 1] of bin indices."""
        return bin_centres(tokens, self.config.num_bins)

    def action_to_tokens(self, action: torch.Tensor) -> torch.Tensor:
        """Bin index of each (clipped) action value."""
        return action_bins(action, self.config.num_bins)

    def _prefix(self, images: torch.Tensor, instructions: Sequence[str]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        if tuple(images.shape[1:]) != cfg.image_shape or len(instructions) != len(images):
            raise ShapeError(f"expected images [N, *{cfg.image_shape}] and N instructions, got "
                             f"{tuple(images.shape)} and {len(instructions)}")
        p = cfg.patch_size
        pixels = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
        patches = pixels.unfold(2, p, p).unfold(3, p, p)  # [N, C, H/p, W/p, p, p]
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(len(images), self.num_patches, -1)
        text = self.tokenizer(list(instructions), padding="max_length", truncation=True,
                              max_length=cfg.max_instruction_tokens, return_tensors="pt")
        embed = self.lm.get_input_embeddings()
        device = images.device
        prefix = torch.cat([self.patch_embed(patches), embed(text["input_ids"].to(device))],
                           dim=1)
        mask = torch.cat([torch.ones(len(images), self.num_patches, dtype=torch.long,
                                     device=device),
                          text["attention_mask"].to(device)], dim=1)
        return prefix, mask

    def _run(self, embeds: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Bin logits at every position and the last layer's hidden states."""
        out = self.lm(inputs_embeds=embeds, attention_mask=mask,
                      position_ids=position_ids_from_mask(mask), output_hidden_states=True)
        bins = out.logits[..., self.bin_offset:self.bin_offset + self.config.num_bins]
        return bins, out.hidden_states[-1]

    def _extend(self, embeds: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        added = self.lm.get_input_embeddings()(tokens + self.bin_offset)
        return (torch.cat([embeds, added], dim=1),
                torch.cat([mask, torch.ones_like(tokens)], dim=1))

    @torch.no_grad()
    def act(self, images: torch.Tensor, instructions: Sequence[str], *,
            deterministic: bool = False, generator: torch.Generator | None = None) -> VLASample:
        """Decode one action token per dimension (sampled, or the most likely bin)."""
        embeds, mask = self._prefix(images, instructions)
        prefix_len = embeds.shape[1]
        log_prob = torch.zeros(len(images), device=images.device)
        tokens = torch.empty(len(images), 0, dtype=torch.long, device=images.device)
        value = torch.zeros(len(images), device=images.device)
        for _ in range(self.config.action_dim):
            logits, hidden = self._run(embeds, mask)
            if tokens.shape[1] == 0:
                value = self.value_head(hidden[:, prefix_len - 1]).squeeze(-1)
            token, token_log_prob = sample_action_token(
                logits[:, -1], deterministic=deterministic, generator=generator)
            log_prob += token_log_prob
            tokens = torch.cat([tokens, token[:, None]], dim=1)
            embeds, mask = self._extend(embeds, mask, token[:, None])
        return VLASample(tokens=tokens, action=self.tokens_to_action(tokens),
                         log_prob=log_prob, value=value)

    def value(self, images: torch.Tensor, instructions: Sequence[str]) -> torch.Tensor:
        """``[N]`` critic estimate of the observations (one pass over the prefix)."""
        embeds, mask = self._prefix(images, instructions)
        _, hidden = self._run(embeds, mask)
        return self.value_head(hidden[:, -1]).squeeze(-1)

    def evaluate(self, images: torch.Tensor, instructions: Sequence[str], tokens: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Differentiable ``(log_prob [N], entropy [N], value [N])`` of given action tokens,
        in one teacher-forced pass."""
        embeds, mask = self._prefix(images, instructions)
        prefix_len = embeds.shape[1]
        embeds, mask = self._extend(embeds, mask, tokens[:, :-1])
        logits, hidden = self._run(embeds, mask)
        picked, entropy = score_action_tokens(logits[:, prefix_len - 1:], tokens,
                                              action_dim=self.config.action_dim)
        value = self.value_head(hidden[:, prefix_len - 1]).squeeze(-1)
        return picked, entropy, value
