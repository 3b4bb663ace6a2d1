"""megatron-core's parallel state and this rank's GPT stage, built from a Hugging Face model.

`initialize_parallel` cuts the actor's process group into tensor-, pipeline- and
data-parallel groups (megatron-core's ``parallel_state``, a per-process singleton);
`build_stage` builds this rank's share of the decoder with megatron-core's local layer spec
(no Transformer Engine, no fused kernels: both need CUDA builds) and loads the Hugging Face
weights into it (`convert.hf_to_megatron`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlinf.workers.actor.megatron.convert import hf_to_megatron
from rlinf.workers.actor.megatron.cpu import enable_cpu_execution
from rlinf.workers.actor.megatron.layout import MegatronConfig, ModelShape
from rlinf.workers.errors import ConfigError, MissingExtraError

__all__ = ["build_stage", "initialize_parallel", "require_megatron"]


def require_megatron() -> None:
    """MissingExtraError naming the install command when megatron-core is absent."""
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        raise MissingExtraError("actor.backend=megatron", "megatron", "megatron.core") from None


def initialize_parallel(config: MegatronConfig, *, seed: int) -> int:
    """Split the default process group into megatron-core's groups (once per process; the
    same degrees again are a no-op); returns the data-parallel degree. Seeds the
    model-parallel RNG streams."""
    import torch.distributed as dist

    require_megatron()
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError("the Megatron actor needs its ranks' process group first "
                          "(torch.distributed.init_process_group); one process uses a "
                          "group of one")
    enable_cpu_execution()
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    data_parallel = config.data_parallel(dist.get_world_size())
    if ps.model_parallel_is_initialized():
        if (ps.get_tensor_model_parallel_world_size(),
                ps.get_pipeline_model_parallel_world_size()) == (
                config.tensor_parallel, config.pipeline_parallel):
            return data_parallel
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=config.tensor_parallel,
                                 pipeline_model_parallel_size=config.pipeline_parallel)
    model_parallel_cuda_manual_seed(seed)
    return data_parallel


def transformer_config(shape: ModelShape, config: MegatronConfig) -> Any:
    """megatron-core's ``TransformerConfig`` reproducing the Hugging Face decoder (fp32
    parameters: bf16 runs under autocast, as the other backends do)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=shape.num_layers, hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_heads, num_query_groups=shape.num_kv_heads,
        kv_channels=shape.head_dim, ffn_hidden_size=shape.ffn_hidden_size,
        tensor_model_parallel_size=config.tensor_parallel,
        pipeline_model_parallel_size=config.pipeline_parallel,
        sequence_parallel=config.sequence_parallel,
        normalization="RMSNorm", layernorm_epsilon=shape.norm_eps,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, add_qkv_bias=shape.qkv_bias,
        hidden_dropout=0.0, attention_dropout=0.0,
        params_dtype=torch.float32, pipeline_dtype=torch.float32,
        use_cpu_initialization=True, perform_initialization=False,
        # The fused paths need CUDA kernels; the unfused ones compute the same.
        bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False)


def build_stage(hf_model: nn.Module, shape: ModelShape, config: MegatronConfig, *,
                device: torch.device) -> nn.Module:
    """This rank's stage of the decoder (after `initialize_parallel`), holding `hf_model`'s
    weights, on `device`."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_model import GPTModel

    shape.check(config)
    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    stage = ps.get_pipeline_model_parallel_rank()
    megatron_config = transformer_config(shape, config)
    model = GPTModel(
        config=megatron_config,
        transformer_layer_spec=block_spec(megatron_config),
        vocab_size=shape.vocab_size, max_sequence_length=shape.max_positions,
        pre_process=first, post_process=last, position_embedding_type="rope",
        rotary_base=int(shape.rope_theta),
        # Across stages megatron-core would copy the tied embedding to the last stage with
        # ``.cuda()``: that stage gets its own copy of the weights instead, and the trainer
        # adds the two copies' gradients (`MegatronActor._sync_gradients`).
        share_embeddings_and_output_weights=shape.tie_embeddings and first and last)
    weights = hf_to_megatron(
        hf_model.state_dict(), shape, tp_rank=ps.get_tensor_model_parallel_rank(),
        tp_size=config.tensor_parallel,
        layers=shape.stage_layers(config.pipeline_parallel, stage),
        first_stage=first, last_stage=last)
    if shape.tie_embeddings and first and last:
        weights.pop("output_layer.weight", None)  # the embedding itself is the head here
    _mark_tensor_parallel(model)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [name for name in missing if not name.endswith("_extra_state")]
    if missing or unexpected:
        raise ConfigError(f"Hugging Face → megatron weights did not line up: missing "
                          f"{missing[:5]}, unexpected {unexpected[:5]}")
    return model.to(device)


def block_spec(megatron_config: Any) -> Any:
    """This stage's decoder block: megatron-core's local layer spec with torch's
    scaled-dot-product attention (`sdpa_attention`) and RMSNorms that also run on a
    sequence-parallel shard (`rms_norm`), for the layers and the final norm."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    layer = get_gpt_layer_local_spec(normalization="RMSNorm")
    layer.submodules.self_attention.submodules.core_attention = sdpa_attention()
    layer.submodules.input_layernorm = rms_norm()
    layer.submodules.pre_mlp_layernorm = rms_norm()
    return TransformerBlockSubmodules(
        layer_specs=[layer] * get_num_layers_to_build(megatron_config), layer_norm=rms_norm())


_RMS_NORM: list[type] = []


def rms_norm() -> type:
    """torch's RMSNorm as megatron-core builds a norm, allowed under sequence parallelism.
    (megatron-core's torch-norm wrapper refuses it; its Transformer Engine norm, which
    allows it, needs CUDA.) A norm acts on each token alone, so on a shard of the sequence
    it computes that shard's rows exactly; its weight's gradient is then a partial sum, and
    the weight is tagged ``sequence_parallel`` for the trainer to sum it over the
    tensor-parallel group, as megatron-core's Transformer Engine norms are."""
    if _RMS_NORM:
        return _RMS_NORM[0]

    class RmsNorm(torch.nn.RMSNorm):
        def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5,
                     **_unused: Any) -> None:
            super().__init__(hidden_size, eps=eps)
            self.weight.sequence_parallel = bool(  # type: ignore[attr-defined]
                config.sequence_parallel)

    _RMS_NORM.append(RmsNorm)
    return RmsNorm


_SDPA_ATTENTION: list[type] = []


def sdpa_attention() -> type:
    """megatron-core's local ``DotProductAttention`` computed by torch's
    ``scaled_dot_product_attention`` (flash or memory-efficient kernels where the device has
    them) instead of its unfused matmul-softmax-matmul: the same mask, scale and head
    grouping. A padded query row that may attend to nothing attends to itself (as
    transformers does): an all-masked row would give NaN, which the probability-0 product
    with the values would carry into the valid rows. (Defined here: megatron-core is an
    extra, imported only when the actor is built.)"""
    if _SDPA_ATTENTION:
        return _SDPA_ATTENTION[0]
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class SdpaAttention(DotProductAttention):  # type: ignore[misc]
        def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,  # noqa: PLR0917 (megatron-core calls it so)
                    attention_mask: torch.Tensor | None, attn_mask_type: Any = None,
                    attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
            if attention_bias is not None or packed_seq_params is not None:
                raise ConfigError("the Megatron actor's attention takes no bias and no "
                                  "packed sequences")
            # [s, b, heads, d] -> [b, heads, s, d]
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            repeat = q.shape[1] // k.shape[1]
            if repeat > 1:
                k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
            allowed = None
            if attention_mask is not None:
                allowed = ~attention_mask
                length = allowed.shape[-1]
                allowed = allowed | torch.eye(length, dtype=torch.bool, device=allowed.device)
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, scale=self.softmax_scale,
                dropout_p=self.attention_dropout.p if self.training else 0.0)
            rows, heads, length, width = out.shape
            return out.permute(2, 0, 1, 3).reshape(length, rows, heads * width)

    _SDPA_ATTENTION.append(SdpaAttention)
    return SdpaAttention


_SPLIT_DIMS = (("word_embeddings.weight", 0), ("output_layer.weight", 0),
               ("linear_qkv.weight", 0), ("linear_qkv.bias", 0), ("linear_fc1.weight", 0),
               ("linear_proj.weight", 1), ("linear_fc2.weight", 1))
"""Parameters split across tensor-parallel ranks (`convert`), with the split dimension."""


def _mark_tensor_parallel(model: nn.Module) -> None:
    """Tag split parameters as megatron-core does when it initialises them itself: with
    ``perform_initialization=False`` (the weights come from Hugging Face) it leaves the
    tags unset, and its norm and checkpoint utilities would count every shard as a
    replica."""
    for name, param in model.named_parameters():
        for suffix, dim in _SPLIT_DIMS:
            if name.endswith(suffix) and not getattr(param, "tensor_model_parallel", False):
                for attribute, value in (("tensor_model_parallel", True),
                                         ("partition_dim", dim), ("partition_stride", 1)):
                    setattr(param, attribute, value)
