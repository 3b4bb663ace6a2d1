"""Weights between a Hugging Face Qwen2/Llama state dict and megatron-core's GPT layout.

megatron-core's names (local layer spec) and layouts, per tensor-parallel rank ``r`` of
``tp``:

- ``embedding.word_embeddings.weight`` and ``output_layer.weight``: rows (vocabulary)
  split in ``tp`` contiguous parts;
- ``linear_qkv`` (weight and bias): for each key/value group, that group's query heads,
  then its key head, then its value head; rank ``r`` holds groups
  ``r*g/tp .. (r+1)*g/tp - 1``;
- ``mlp.linear_fc1``: the SwiGLU gate and up projections stacked, ``[gate_r; up_r]``, each
  rank stacking its own rows of both;
- ``linear_proj`` and ``mlp.linear_fc2``: columns split (row-parallel);
- norms replicated.

Layers are numbered per pipeline stage from 0. Pure torch: no megatron-core needed, so the
conversion is tested on its own (`hf_to_megatron` then `megatron_to_hf` is the identity).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

import torch

from rlinf.workers.actor.megatron.layout import ModelShape
from rlinf.workers.errors import ConfigError

__all__ = ["hf_policy_from_checkpoint", "hf_to_megatron", "megatron_to_hf", "shards_to_hf"]

_HF_LAYER = "model.layers.{}."
_MG_LAYER = "decoder.layers.{}."


def hf_to_megatron(hf: Mapping[str, torch.Tensor], shape: ModelShape, *, tp_rank: int,
                   tp_size: int, layers: range, first_stage: bool,
                   last_stage: bool) -> dict[str, torch.Tensor]:
    """The megatron state dict of one rank: tensor-parallel rank `tp_rank` of `tp_size`,
    holding the global decoder `layers` (numbered from 0 in the result); the embedding on
    the first stage, the final norm and output layer on the last (the output layer also
    when embeddings are tied, as a copy megatron keeps in sync)."""

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp_size, dim=0)[tp_rank]

    def cols(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp_size, dim=1)[tp_rank]

    out: dict[str, torch.Tensor] = {}
    if first_stage:
        out["embedding.word_embeddings.weight"] = rows(_get(hf, "model.embed_tokens.weight"))
    for local, layer in enumerate(layers):
        src, dst = _HF_LAYER.format(layer), _MG_LAYER.format(local)
        out[dst + "input_layernorm.weight"] = _get(hf, src + "input_layernorm.weight")
        out[dst + "pre_mlp_layernorm.weight"] = _get(hf, src + "post_attention_layernorm.weight")
        attention = src + "self_attn."
        for kind in ("weight", "bias") if shape.qkv_bias else ("weight",):
            q, k, v = (_get(hf, f"{attention}{p}_proj.{kind}") for p in "qkv")
            fused = _fuse_qkv(q, k, v, shape)
            out[f"{dst}self_attention.linear_qkv.{kind}"] = rows(fused)
        out[dst + "self_attention.linear_proj.weight"] = cols(_get(hf, attention + "o_proj.weight"))
        gate, up = (rows(_get(hf, f"{src}mlp.{p}_proj.weight")) for p in ("gate", "up"))
        out[dst + "mlp.linear_fc1.weight"] = torch.cat([gate, up])
        out[dst + "mlp.linear_fc2.weight"] = cols(_get(hf, src + "mlp.down_proj.weight"))
    if last_stage:
        out["decoder.final_layernorm.weight"] = _get(hf, "model.norm.weight")
        head = "model.embed_tokens.weight" if shape.tie_embeddings else "lm_head.weight"
        out["output_layer.weight"] = rows(_get(hf, head))
    return {name: tensor.detach().clone() for name, tensor in out.items()}


def megatron_to_hf(stages: Sequence[Sequence[Mapping[str, torch.Tensor]]],
                   shape: ModelShape) -> dict[str, torch.Tensor]:
    """The full Hugging Face state dict from every rank's megatron state dict:
    ``stages[p][r]`` is pipeline stage ``p``'s tensor-parallel rank ``r``. With tied
    embeddings ``lm_head.weight`` is the embedding (as ``PreTrainedModel.state_dict``)."""
    pp = len(stages)
    if pp == 0 or any(len(s) != len(stages[0]) for s in stages):
        raise ConfigError("megatron_to_hf needs every pipeline stage's tensor-parallel ranks")

    def rows(stage: int, name: str) -> torch.Tensor:
        return torch.cat([_get(shard, name) for shard in stages[stage]], dim=0)

    def cols(stage: int, name: str) -> torch.Tensor:
        return torch.cat([_get(shard, name) for shard in stages[stage]], dim=1)

    hf = {"model.embed_tokens.weight": rows(0, "embedding.word_embeddings.weight")}
    for stage in range(pp):
        for local, layer in enumerate(shape.stage_layers(pp, stage)):
            src, dst = _MG_LAYER.format(local), _HF_LAYER.format(layer)
            replica = stages[stage][0]
            hf[dst + "input_layernorm.weight"] = _get(replica, src + "input_layernorm.weight")
            hf[dst + "post_attention_layernorm.weight"] = _get(
                replica, src + "pre_mlp_layernorm.weight")
            for kind in ("weight", "bias") if shape.qkv_bias else ("weight",):
                q, k, v = _split_qkv(rows(stage, f"{src}self_attention.linear_qkv.{kind}"), shape)
                for name, part in zip("qkv", (q, k, v), strict=True):
                    hf[f"{dst}self_attn.{name}_proj.{kind}"] = part
            hf[dst + "self_attn.o_proj.weight"] = cols(
                stage, src + "self_attention.linear_proj.weight")
            halves = [_get(s, src + "mlp.linear_fc1.weight").chunk(2) for s in stages[stage]]
            hf[dst + "mlp.gate_proj.weight"] = torch.cat([gate for gate, _ in halves])
            hf[dst + "mlp.up_proj.weight"] = torch.cat([up for _, up in halves])
            hf[dst + "mlp.down_proj.weight"] = cols(stage, src + "mlp.linear_fc2.weight")
    hf["model.norm.weight"] = _get(stages[-1][0], "decoder.final_layernorm.weight")
    hf["lm_head.weight"] = (hf["model.embed_tokens.weight"] if shape.tie_embeddings
                            else rows(pp - 1, "output_layer.weight"))
    return hf


def hf_policy_from_checkpoint(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The policy of an actor checkpoint `directory` in Hugging Face names: reassembled from
    every rank's shard when a Megatron actor wrote it, rank 0's policy otherwise."""
    from rlinf.workers.actor.checkpoint import read_rank_files

    files = read_rank_files(directory)

    def policy(model: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k.removeprefix("policy."): v for k, v in model.items()
                if k.startswith("policy.") and isinstance(v, torch.Tensor)}

    layout = files[0]["layout"]
    if layout.get("backend") != "megatron":
        return policy(files[0]["model"])
    try:
        return shards_to_hf(
            ((int(e["layout"]["pipeline_stage"]), int(e["layout"]["tensor_rank"]),
              policy(e["model"])) for e in files if e["layout"].get("data_rank", 0) == 0),
            ModelShape(**layout["shape"]), tensor_parallel=int(layout["tensor_parallel"]),
            pipeline_parallel=int(layout["pipeline_parallel"]))
    except ConfigError as exc:
        raise ConfigError(f"{directory}: {exc}") from None


def shards_to_hf(shards: Iterable[tuple[int, int, Mapping[str, torch.Tensor]]],
                 shape: ModelShape, *, tensor_parallel: int,
                 pipeline_parallel: int) -> dict[str, torch.Tensor]:
    """`megatron_to_hf` of ``(pipeline stage, tensor rank, state dict)`` shards in any order,
    one per place of a tensor_parallel x pipeline_parallel cut; ConfigError if one is
    missing."""
    stages: list[list[Mapping[str, torch.Tensor] | None]] = [
        [None] * tensor_parallel for _ in range(pipeline_parallel)]
    for stage, tensor_rank, state in shards:
        stages[stage][tensor_rank] = state
    missing = [(p, t) for p, row in enumerate(stages) for t, shard in enumerate(row)
               if shard is None]
    if missing:
        raise ConfigError(f"the shards of (pipeline stage, tensor rank) {missing} of the "
                          f"tensor_parallel={tensor_parallel} x pipeline_parallel="
                          f"{pipeline_parallel} cut are missing")
    return megatron_to_hf([[s for s in row if s is not None] for row in stages], shape)


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              shape: ModelShape) -> torch.Tensor:
    """Q, K, V projections (weights or biases) in megatron's grouped order."""
    groups, d = shape.num_kv_heads, shape.head_dim
    per_group = shape.num_heads // groups
    q = q.reshape(groups, per_group * d, *q.shape[1:])
    k = k.reshape(groups, d, *k.shape[1:])
    v = v.reshape(groups, d, *v.shape[1:])
    return torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[2:])


def _split_qkv(fused: torch.Tensor,
               shape: ModelShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of `_fuse_qkv`."""
    groups, d = shape.num_kv_heads, shape.head_dim
    per_group = shape.num_heads // groups
    grouped = fused.reshape(groups, (per_group + 2) * d, *fused.shape[1:])
    q, k, v = grouped.split([per_group * d, d, d], dim=1)
    rest = fused.shape[1:]
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _get(state: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    try:
        return state[name]
    except KeyError:
        raise ConfigError(f"weight {name!r} is missing from the state dict (has "
                          f"{len(state)} tensors, e.g. {sorted(state)[:3]})") from None
