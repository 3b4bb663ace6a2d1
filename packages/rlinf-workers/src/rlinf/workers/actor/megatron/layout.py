"""How a Megatron actor is cut: `MegatronConfig` (tensor, pipeline and data parallel
degrees) and `ModelShape` (the decoder's dimensions, read from a Hugging Face config).

Pure Python: checked before megatron-core is imported or a process group exists, so a bad
degree fails with a message at config time, not deep inside megatron-core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlinf.sched import Cluster, CostModel, TrainerCost
from rlinf.workers.errors import ConfigError

__all__ = ["MegatronConfig", "ModelShape", "trainer_cost"]

_FAMILIES = ("qwen2", "llama")


@dataclass(frozen=True)
class MegatronConfig:
    """Model parallelism of the Megatron actor; data parallelism is what remains of the
    actor's ranks (``world_size / (tensor_parallel * pipeline_parallel)``)."""

    tensor_parallel: int = 1
    """Ranks a layer's matrices (and the vocabulary) are split across."""
    pipeline_parallel: int = 1
    """Stages the decoder's layers are split into (equal numbers of layers)."""
    sequence_parallel: bool = False
    """Megatron's sequence parallelism (needs tensor_parallel > 1): outside attention and
    the MLP, each tensor-parallel rank keeps 1/tp of the sequence's activations (norms,
    residuals, the hidden states between pipeline stages), and the all-reduces around each
    layer become an all-gather and a reduce-scatter of the same volume. Saves activation
    memory; the loss and gradients are the same."""
    distributed_optimizer: bool = False
    """Megatron's distributed optimizer (ZeRO-1): the data-parallel ranks split AdamW's
    state, each stepping its range of the parameters between a reduce-scatter of the
    gradients and an all-gather of the parameters (`DistributedAdamW`). Saves
    (dp - 1)/dp of the moments' memory; the update is the same. False: every data-parallel
    rank keeps the whole shard's AdamW state, gradients all-reduced."""

    def __post_init__(self) -> None:
        if self.tensor_parallel < 1 or self.pipeline_parallel < 1:
            raise ConfigError(f"megatron tensor_parallel and pipeline_parallel must be >= 1, "
                              f"got {self.tensor_parallel} and {self.pipeline_parallel}")
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise ConfigError("megatron sequence_parallel splits the sequence across "
                              "tensor-parallel ranks: set tensor_parallel > 1 or "
                              "sequence_parallel=false")

    @property
    def model_parallel(self) -> int:
        """Ranks that hold one copy of the model."""
        return self.tensor_parallel * self.pipeline_parallel

    def data_parallel(self, world_size: int) -> int:
        """Data-parallel degree on `world_size` actor ranks; ConfigError if it is not whole."""
        if world_size < 1 or world_size % self.model_parallel:
            raise ConfigError(
                f"{world_size} actor rank(s) cannot hold tensor_parallel="
                f"{self.tensor_parallel} x pipeline_parallel={self.pipeline_parallel}: give the "
                f"actor a multiple of {self.model_parallel} devices")
        return world_size // self.model_parallel


@dataclass(frozen=True)
class ModelShape:
    """A Qwen2- or Llama-style decoder's dimensions, as megatron-core needs them."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    qkv_bias: bool
    tie_embeddings: bool
    norm_eps: float
    rope_theta: float
    max_positions: int

    @classmethod
    def from_hf(cls, hf_config: Any) -> ModelShape:
        """Read a transformers config (``model.config``); ConfigError for other families or
        features megatron's GPT layers do not reproduce here (sliding windows, rope scaling)."""
        family = str(getattr(hf_config, "model_type", ""))
        if family not in _FAMILIES:
            raise ConfigError(f"actor.backend=megatron builds Qwen2 and Llama decoders; this "
                              f"model is {family or 'of unknown type'!r}")
        if getattr(hf_config, "use_sliding_window", False):
            raise ConfigError("actor.backend=megatron: sliding-window attention is not "
                              "supported; use a model config with use_sliding_window=false")
        rope = dict(getattr(hf_config, "rope_scaling", None) or {})
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ConfigError(f"actor.backend=megatron: rope_scaling {rope!r} is not "
                              "supported yet (plain rotary embeddings only)")
        theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        heads = int(hf_config.num_attention_heads)
        hidden = int(hf_config.hidden_size)
        head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
        qkv_bias = family == "qwen2" or bool(getattr(hf_config, "attention_bias", False))
        if family == "llama" and getattr(hf_config, "mlp_bias", False):
            raise ConfigError("actor.backend=megatron: Llama's mlp_bias is not supported")
        return cls(family=family, vocab_size=int(hf_config.vocab_size), hidden_size=hidden,
                   num_layers=int(hf_config.num_hidden_layers), num_heads=heads,
                   num_kv_heads=int(getattr(hf_config, "num_key_value_heads", None) or heads),
                   head_dim=int(head_dim), ffn_hidden_size=int(hf_config.intermediate_size),
                   qkv_bias=qkv_bias, tie_embeddings=bool(hf_config.tie_word_embeddings),
                   norm_eps=float(hf_config.rms_norm_eps),
                   rope_theta=float(theta),
                   max_positions=int(hf_config.max_position_embeddings))

    def check(self, config: MegatronConfig) -> None:
        """ConfigError naming the dimension that `config`'s degrees do not divide."""
        tp, pp = config.tensor_parallel, config.pipeline_parallel
        for name, value in (("vocab_size", self.vocab_size),
                            ("num_key_value_heads", self.num_kv_heads),
                            ("num_attention_heads", self.num_heads),
                            ("intermediate_size", self.ffn_hidden_size)):
            if value % tp:
                raise ConfigError(f"tensor_parallel={tp} must divide the model's {name} "
                                  f"({value})")
        if self.num_layers % pp:
            raise ConfigError(f"pipeline_parallel={pp} must divide the model's "
                              f"num_hidden_layers ({self.num_layers})")

    def stage_layers(self, pipeline_parallel: int, stage: int) -> range:
        """Global indices of the decoder layers pipeline `stage` holds (equal shares, as
        megatron-core splits them)."""
        per = self.num_layers // pipeline_parallel
        return range(stage * per, (stage + 1) * per)


def trainer_cost(model: Any, measured: CostModel, cluster: Cluster, *, batch: int,
                 tokens_per_item: int, micro_batch: int, bf16: bool) -> TrainerCost:
    """`model`'s trainer as a `rlinf.sched.TrainerCost` for pricing its cuts: its shape, the
    step's tokens, the cluster's links and smallest device memory, and a compute rate that
    reproduces the `measured` step of the whole `batch` on one device (so the model's
    compute and communication weigh as they do on this cluster)."""
    shape = ModelShape.from_hf(getattr(model, "config", None))
    parameters = float(sum(p.numel() for p in model.parameters()))
    one_device = measured.time("actor", batch_size=batch, num_devices=1)
    return TrainerCost(
        parameters=parameters, layers=shape.num_layers, hidden=shape.hidden_size,
        heads=shape.num_heads, kv_heads=shape.num_kv_heads, vocab=shape.vocab_size,
        tokens_per_item=tokens_per_item, micro_batch=micro_batch,
        device_flops=6 * parameters * tokens_per_item * batch / max(one_device, 1e-9),
        efficiency=1.0, bandwidth=cluster.intra_node_bandwidth,
        latency=max(cluster.intra_node_latency, cluster.message_latency, 1e-9),
        device_memory=float(min(d.memory_bytes for d in cluster.devices)),
        activation_bytes=2.0 if bf16 else 4.0)
