"""`MegatronActor`: the actor's GRPO and PPO training on a megatron-core GPT cut by tensor,
pipeline and data parallelism.

It is an `PolicyTrainer` (the same batches, advantages, micro-batches, loss terms,
aggregation, metrics and checkpoints); only the model and what crosses ranks differ:

- each micro-batch runs through the pipeline stages (`pipeline.run_stages`); the last
  stage computes log-probs and entropies from its share of the vocabulary
  (`vocab_parallel`) and the loss, weighted by the micro-batch's share of the loss units
  of every data-parallel rank, so a step equals one process training on the whole batch;
- gradients are summed over the data-parallel group once per optimizer step, and the
  tied embedding's two copies (first and last stage) add their gradients;
- the gradient norm is taken over every model-parallel shard once (replicated norms
  count once), then AdamW steps each rank's shard: Adam is elementwise, so the update is
  exactly the unsharded one; with ``distributed_optimizer`` the data-parallel ranks also
  split the shard's AdamW state (`DistributedAdamW`: reduce-scatter, step, all-gather);
- `state_dict_for_rollout` gathers the shards back into Hugging Face names and layout.

PPO's critic is a second stage of the same cut with a value head (`critic`), in a parameter
group of its own (its learning rate; its gradient clipped by its own norm): each step runs
the policy's micro-batches through the pipeline with the policy terms of the loss, then the
critic's with the value term. The two models share no parameter, so the gradients are
those of the summed loss. The critic's values for GAE are
a forward-only pass, and advantages are whitened over the data-parallel group.

Every actor rank holds its data-parallel replica's whole batch (tensor- and
pipeline-parallel peers train on the same rows).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog
import torch
from torch import nn

from rlinf.workers.actor import checkpoint as ckpt
from rlinf.workers.actor.config import ActorConfig
from rlinf.workers.actor.megatron.convert import shards_to_hf
from rlinf.workers.actor.megatron.critic import build_value_stage
from rlinf.workers.actor.megatron.distributed_optimizer import DistributedAdamW
from rlinf.workers.actor.megatron.gather import gather_shards
from rlinf.workers.actor.megatron.layout import MegatronConfig, ModelShape
from rlinf.workers.actor.megatron.model import build_stage, initialize_parallel
from rlinf.workers.actor.megatron.pipeline import StageInput, run_stages
from rlinf.workers.actor.megatron.vocab_parallel import vocab_parallel_log_probs_and_entropy
from rlinf.workers.actor.worker import PolicyTrainer, kl_controller_for, optimizer_groups
from rlinf.workers.algorithms import LossAggregation
from rlinf.workers.errors import ConfigError
from rlinf.workers.models import compute_precision
from rlinf.workers.rollout.batch import RolloutBatch
from rlinf.workers.weight_sync.buckets import Bucket, iter_buckets

__all__ = ["MegatronActor"]

_log = structlog.get_logger(__name__)

DISTRIBUTED = "distributed"
"""Folder of a Megatron actor checkpoint in megatron-core's distributed (reshardable) format."""

_CRITIC = "critic."
"""Prefix of the critic's tensors in the distributed checkpoint (the policy's have none)."""


def _init_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter AdamW state (zeros, as before its first step) so a sharded
    template exists for each; parameters that already have state keep it."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state[param]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param,
                                                       memory_format=torch.preserve_format)


class MegatronActor(PolicyTrainer):
    """GRPO and PPO trainer on megatron-core (see the module docstring)."""

    def __init__(self, model: nn.Module, *, config: ActorConfig | None = None,
                 megatron: MegatronConfig | None = None,
                 device: torch.device | str | None = None, seed: int = 0) -> None:
        """Cut `model` (a Hugging Face Qwen2 or Llama causal LM, equal on every rank) for
        this rank, after the actor's process group is up; with ``algorithm="ppo"`` a critic
        is cut from it too."""
        config = config or ActorConfig()
        self.megatron = megatron or MegatronConfig()
        self.shape = ModelShape.from_hf(getattr(model, "config", None))
        self.shape.check(self.megatron)
        self.config = config
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.data_parallel = initialize_parallel(self.megatron, seed=seed)
        self.policy = build_stage(model, self.shape, self.megatron, device=self.device)
        self.policy.train()
        self.critic: nn.Module | None = None  # type: ignore[assignment]
        if config.algorithm == "ppo":
            self.critic = build_value_stage(model, self.shape, self.megatron,
                                            device=self.device)
            self.critic.train()
        self.optimizer: torch.optim.AdamW
        critic = [] if self.critic is None else list(self.critic.parameters())
        groups = optimizer_groups(config, list(self.policy.parameters()), critic)
        if self.megatron.distributed_optimizer:
            from megatron.core import parallel_state as ps

            self.optimizer = DistributedAdamW(
                groups, group=ps.get_data_parallel_group(),
                lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
        else:
            self.optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=config.betas,
                                               weight_decay=config.weight_decay)
        self.global_step = 0
        self._agg = LossAggregation.parse(config.aggregation)
        self.kl_controller = kl_controller_for(config)

    def _trained_parameters(self) -> list[nn.Parameter]:
        """The policy's parameters, then the critic's (the optimizer's order)."""
        critic = [] if self.critic is None else list(self.critic.parameters())
        return list(self.policy.parameters()) + critic

    # -- what PolicyTrainer's training loop calls --------------------------------------------

    @property
    def can_stream(self) -> bool:
        """Streaming accumulation is not offered: the pipeline runs a mini-batch at once."""
        return False

    def _optimizer_step(self, data: dict[str, torch.Tensor], rows: slice) -> dict[str, float]:
        """One optimizer step on `rows` of this data-parallel replica's batch (see the module
        docstring)."""
        from megatron.core import parallel_state as ps

        cfg = self.config
        local_units = self._units(data["loss_mask"][rows])
        total_units = float(self._sum(torch.tensor([local_units]), ps.get_data_parallel_group())[0])
        micros = [m for m in self._micro_batches(data, torch.arange(rows.start, rows.stop))
                  if self._units(m["loss_mask"]) > 0]
        keys = self.metric_keys
        sums = torch.zeros(len(keys), dtype=torch.float64)

        def weighed(loss: torch.Tensor, metrics: dict[str, float],
                    micro: dict[str, torch.Tensor]) -> torch.Tensor:
            units = self._units(micro["loss_mask"])
            sums.add_(torch.tensor([metrics.get(k, 0.0) * units for k in keys],
                                   dtype=torch.float64))
            return loss * (units / total_units)

        def policy_loss(logits: torch.Tensor, index: int) -> torch.Tensor:
            log_probs, entropy = self._response_terms(logits, micros[index])
            return weighed(*self._policy_terms(micros[index], log_probs, entropy),
                           micros[index])

        def critic_loss(values: torch.Tensor, index: int) -> torch.Tensor:
            return weighed(*self._value_terms(micros[index],
                                              self._response_values(values, micros[index])),
                           micros[index])

        if total_units > 0 and micros:
            inputs = [self._stage_input(m) for m in micros]
            with compute_precision(cfg.precision, self.device):
                run_stages(self.policy, inputs, policy_loss,
                           hidden_size=self.shape.hidden_size, device=self.device,
                           sequence_shards=self._sequence_shards)
                if self.critic is not None:
                    run_stages(self.critic, inputs, critic_loss,
                               hidden_size=self.shape.hidden_size, device=self.device,
                               sequence_shards=self._sequence_shards)
        self._sync_gradients()
        # Metrics live on the last stage: summed over data-parallel replicas, then shared
        # with the other stages so every rank returns the same.
        sums = self._sum(sums, ps.get_data_parallel_group())
        sums = self._from_last_stage(sums)
        result = ({key: float(value) / total_units for key, value in zip(keys, sums.tolist(),
                                                                          strict=True)}
                  if total_units else {})
        if total_units > 0:
            result.update(self._clip_gradients())
            self.optimizer.step()
            if isinstance(self.optimizer, DistributedAdamW):
                self.optimizer.gather_parameters()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        return result

    # -- forward pieces --------------------------------------------------------------------

    def _stage_input(self, micro: dict[str, torch.Tensor]) -> StageInput:
        """Prompt and response as one left- and right-padded sequence, with a causal mask
        that also hides padding.
        megatron's rotary embedding counts positions from the first column; attention
        between valid tokens depends only on their distance, so the left padding does not
        change a valid token's output. Under sequence parallelism the sequence is padded on
        the right to a multiple of the tensor-parallel degree (masked columns after the
        response, which the loss never reads)."""
        tokens = torch.cat([micro["prompt_ids"], micro["response_ids"]], dim=1)
        valid = torch.cat([micro["prompt_mask"], micro["response_mask"]], dim=1).bool()
        extra = -tokens.shape[1] % self._sequence_shards
        if extra:
            tokens = torch.nn.functional.pad(tokens, (0, extra))
            valid = torch.nn.functional.pad(valid, (0, extra))
        tokens = torch.where(valid, tokens, torch.zeros_like(tokens))
        length = tokens.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).triu(1)
        mask = causal.unsqueeze(0) | ~valid[:, None, :]
        positions = torch.arange(length, device=tokens.device).expand_as(tokens)
        return StageInput(tokens=tokens, positions=positions, mask=mask.unsqueeze(1))

    def _response_terms(self, logits: torch.Tensor,
                        micro: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, R]`` log-probs and entropies (0 at padding) of the response tokens from the
        last stage's ``[B, S, V/tp]`` logits."""
        prompt_len = micro["prompt_ids"].shape[1]
        response_len = micro["response_ids"].shape[1]
        scaled = logits[:, prompt_len - 1: prompt_len - 1 + response_len].float()
        scaled = scaled / self.config.temperature
        valid = micro["response_mask"].bool()
        labels = torch.where(valid, micro["response_ids"],
                             torch.zeros_like(micro["response_ids"]))
        log_probs, entropy = vocab_parallel_log_probs_and_entropy(scaled, labels)
        weight = valid.to(log_probs.dtype)
        return log_probs * weight, entropy * weight

    def _response_values(self, values: torch.Tensor,
                         micro: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[B, R]`` values of the response tokens (0 at padding) from the critic's last
        stage's ``[B, S, 1]`` output, read where the policy reads each token's logits."""
        prompt_len = micro["prompt_ids"].shape[1]
        response_len = micro["response_ids"].shape[1]
        picked = values[:, prompt_len - 1: prompt_len - 1 + response_len, 0].float()
        return picked * micro["response_mask"].to(picked.dtype)

    def _values(self, data: dict[str, torch.Tensor], rows: slice, *,
                critic: nn.Module | None = None) -> torch.Tensor:
        """``[B, R]`` values of `rows` of `data` (no gradient: GAE's old values), on every
        stage of the pipeline, on the training device."""
        if self.critic is None:
            raise ConfigError("PPO needs a critic; this actor was built without one")
        data = {name: data[name][rows] for name in (
            "prompt_ids", "prompt_mask", "response_ids", "response_mask")}
        return self._last_stage_rows(self.critic, data, self._response_values).to(self.device)

    def _last_stage_rows(
        self, model: nn.Module, data: dict[str, torch.Tensor],
        read: Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor],
    ) -> torch.Tensor:
        """``[B, R]`` per-token figures of every row of `data`, as ``read(output,
        micro-batch)`` takes them from `model`'s last-stage output, in row order on every
        stage (a forward-only pass of the pipeline; float32, on the host)."""
        rows = torch.arange(data["response_ids"].shape[0])
        micros = self._micro_batches(data, rows)
        order = self._longest_first(data, rows)
        parts: list[torch.Tensor] = []

        def collect(output: torch.Tensor, index: int) -> None:
            parts.append(read(output, micros[index]).detach())

        with compute_precision(self.config.precision, self.device):
            run_stages(model, [self._stage_input(m) for m in micros], collect,
                       hidden_size=self.shape.hidden_size, device=self.device,
                       forward_only=True, sequence_shards=self._sequence_shards)
        width = data["response_ids"].shape[1]
        out = torch.zeros(len(rows), width, dtype=torch.float32, device=self.device)
        if parts:
            out[order.to(self.device)] = torch.cat(
                [torch.nn.functional.pad(p.float(), (0, width - p.shape[1])) for p in parts])
        return self._from_last_stage(out.cpu().double()).float()

    def _batch_group(self) -> Any:
        """The data-parallel group: its replicas hold the batch between them (their
        tensor- and pipeline-parallel peers hold the same rows)."""
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_group()

    def training_batch(self, shard: RolloutBatch, *, pad_token_id: int) -> RolloutBatch:
        """The shards the flow delivered to this rank's model-parallel group, concatenated in
        rank order: tensor- and pipeline-parallel peers train on the same rows, and each
        data-parallel replica on its group's (a collective over that group)."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        group = ps.get_model_parallel_group()
        shards: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(shards, shard, group=group)
        present = [s for s in shards if s is not None and s.num_rows > 0]
        if not present:
            return shard
        return RolloutBatch.concat(present, pad_token_id=pad_token_id)

    def response_log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, R]`` log-probs of `batch`'s responses under the current weights, on every
        rank of the pipeline, on the host (no gradient; the model-parallel group's ranks pass
        the same rows)."""
        data = {name: getattr(batch, name).to(self.device) for name in (
            "prompt_ids", "prompt_mask", "response_ids", "response_mask")}
        return self._last_stage_rows(
            self.policy, data, lambda logits, micro: self._response_terms(logits, micro)[0])

    # -- cross-rank reductions ---------------------------------------------------------------

    # Small reductions run on the training device: NCCL groups take no host tensors.

    def _sum(self, values: torch.Tensor, group: Any) -> torch.Tensor:
        """`values` summed over `group` (float64, on the host)."""
        import torch.distributed as dist

        summed = values.to(self.device, torch.float64).clone()
        dist.all_reduce(summed, group=group)
        return summed.cpu()

    def _from_last_stage(self, values: torch.Tensor) -> torch.Tensor:
        """`values` as the last pipeline stage holds them, on every stage (float64, host)."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        if ps.get_pipeline_model_parallel_world_size() == 1:
            return values
        shared = values.to(self.device, torch.float64).contiguous().clone()
        dist.broadcast(shared, src=ps.get_pipeline_model_parallel_last_rank(),
                       group=ps.get_pipeline_model_parallel_group())
        return shared.cpu()

    @property
    def _sequence_shards(self) -> int:
        """How many pieces the sequence is cut into between layers (1 without sequence
        parallelism)."""
        return self.megatron.tensor_parallel if self.megatron.sequence_parallel else 1

    def _sync_gradients(self) -> None:
        """Sum gradients over the tensor-parallel group for the norms under sequence
        parallelism (each rank saw its share of the sequence), over the tied embedding's
        first- and last-stage copies, and over the data-parallel group: one flat all-reduce,
        or with the distributed optimizer a reduce-scatter into each rank's range."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        if self.megatron.sequence_parallel:
            self._all_reduce_gradients(
                group=ps.get_tensor_model_parallel_group(),
                params=[p for p in self._trained_parameters()
                        if getattr(p, "sequence_parallel", False)])
        tied = self._tied_embedding()
        if tied is not None:
            if tied.grad is None:  # both copies take part in the all-reduce
                tied.grad = torch.zeros_like(tied)
            dist.all_reduce(tied.grad, group=ps.get_embedding_group())
        if isinstance(self.optimizer, DistributedAdamW):
            self.optimizer.reduce_scatter_gradients()
        elif self.data_parallel > 1:
            self._all_reduce_gradients(group=ps.get_data_parallel_group())

    def _tied_embedding(self) -> torch.Tensor | None:
        """This stage's copy of a tied embedding when the pipeline has several stages."""
        from megatron.core import parallel_state as ps

        if not self.shape.tie_embeddings or ps.get_pipeline_model_parallel_world_size() == 1:
            return None
        gpt: Any = self.policy  # megatron's GPTModel (untyped)
        if ps.is_pipeline_first_stage():
            return gpt.embedding.word_embeddings.weight  # type: ignore[no-any-return]
        if ps.is_pipeline_last_stage():
            return gpt.output_layer.weight  # type: ignore[no-any-return]
        return None

    def _clip_gradients(self) -> dict[str, float]:
        """Clip the policy's gradient to ``max_grad_norm`` and the critic's to
        ``critic_max_grad_norm``, each by its own norm (`_clip_model`); returns the norms
        (``grad_norm``, ``critic_grad_norm``) of those clipped."""
        cfg = self.config
        policy = len(list(self.policy.parameters()))
        total = len(self._trained_parameters())
        norms: dict[str, float] = {}
        if cfg.max_grad_norm is not None:
            norms["grad_norm"] = self._clip_model(
                cfg.max_grad_norm, [i < policy for i in range(total)])
        if self.critic is not None and cfg.critic_max_grad_norm is not None:
            norms["critic_grad_norm"] = self._clip_model(
                cfg.critic_max_grad_norm, [i >= policy for i in range(total)])
        return norms

    def _clip_model(self, max_norm: float, model: list[bool]) -> float:
        """Clip the gradient of the trained parameters marked in `model` to `max_norm` by
        their norm: squares summed over the model-parallel group, parameters replicated
        across tensor-parallel ranks counted on rank 0 only, the tied embedding on the first
        stage only. Returns the norm."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        tp_rank = ps.get_tensor_model_parallel_rank()
        tied = self._tied_embedding()
        params = self._trained_parameters()
        counted = [mine and (bool(getattr(p, "tensor_model_parallel", False)) or tp_rank == 0)
                   and not (p is tied and not ps.is_pipeline_first_stage())
                   for p, mine in zip(params, model, strict=True)]
        if isinstance(self.optimizer, DistributedAdamW):
            # Each data-parallel rank holds the summed gradient of its range only.
            square = self.optimizer.local_square_norm(counted)
            dist.all_reduce(square, group=ps.get_data_parallel_group())
        else:
            square = torch.zeros(1, dtype=torch.float64, device=self.device)
            for param, count in zip(params, counted, strict=True):
                if count and param.grad is not None:
                    square += param.grad.detach().double().pow(2).sum()
        dist.all_reduce(square, group=ps.get_model_parallel_group())
        norm = float(square.sqrt())
        scale = max_norm / (norm + 1e-6)
        if scale < 1.0:
            if isinstance(self.optimizer, DistributedAdamW):
                self.optimizer.scale_gradients(scale, only=model)
            for param, mine in zip(params, model, strict=True):
                if mine and param.grad is not None:
                    param.grad.mul_(scale)
        return norm

    # -- weights -----------------------------------------------------------------------------

    def state_dict_for_rollout(self, *, bucket_bytes: int = 64 << 20,
                               adapters_only: bool = False) -> Iterator[Bucket]:
        """The whole policy in Hugging Face names and layout, in buckets, on the first rank
        of each model-parallel group (actor rank 0 among them); empty on the others. A
        collective: every rank calls it. (No LoRA here: `adapters_only` is refused.)"""
        if adapters_only:
            raise ConfigError("the Megatron actor trains no LoRA adapters: sync its weights")
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        group = ps.get_model_parallel_group()
        local = {name: tensor.detach() for name, tensor in self.policy.state_dict().items()
                 if isinstance(tensor, torch.Tensor)}
        shards = gather_shards(
            local, (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()),
            group=group, root=dist.get_global_rank(group, 0), device=self.device,
            chunk_bytes=bucket_bytes)
        if shards is None:
            return iter(())
        full = shards_to_hf(shards, self.shape, tensor_parallel=self.megatron.tensor_parallel,
                            pipeline_parallel=self.megatron.pipeline_parallel)
        return iter_buckets([(name, t.to(self.device)) for name, t in full.items()],
                            bucket_bytes=bucket_bytes)

    def save_checkpoint(self, directory: str) -> None:
        """Two views of the same state (a collective: every rank calls it):

        - this rank's file (`checkpoint.save`): its shard of model and optimizer, RNG states,
          step and the cut it belongs to; resuming on the same cut restores it exactly, and
          `hf_policy_from_checkpoint` reassembles the policy from every rank's file;
        - ``distributed/``: model and optimizer in megatron-core's distributed checkpoint
          format, which any other cut of the same model loads (resharded).
        """
        from megatron.core import dist_checkpointing

        ckpt.save(directory, modules=self._modules(), optimizer=self.optimizer,
                  step=self.global_step, layout=self._layout(), extra=self._extra_state())
        target = Path(directory) / DISTRIBUTED
        target.mkdir(parents=True, exist_ok=True)
        dist_checkpointing.save(self._sharded_state(), str(target))

    def load_checkpoint(self, directory: str) -> None:
        """Resume from `save_checkpoint`: this rank's file when the checkpoint was written by
        the same cut (exact, RNG states included), else the distributed checkpoint resharded
        to this cut (model, optimizer and step; the RNG streams start afresh)."""
        from megatron.core import dist_checkpointing
        from megatron.core import parallel_state as ps

        mine = Path(directory) / f"rank{torch.distributed.get_rank()}.pt"
        saved = ckpt.read_rank_file(directory) if mine.is_file() else {}
        if saved.get("layout") == self._layout():
            self.global_step = ckpt.restore(saved, modules=self._modules(),
                                            optimizer=self.optimizer)
            self._load_extra_state(saved.get("extra") or {})
            return
        source = Path(directory) / DISTRIBUTED
        if not (source / "metadata.json").is_file():
            raise ConfigError(f"{directory} was written by another cut and holds no "
                              f"{DISTRIBUTED}/ checkpoint to reshard from")
        loaded = dist_checkpointing.load(self._sharded_state(), str(source))
        self.policy.load_state_dict(loaded["model"], strict=False)
        if self.critic is not None:
            self.critic.load_state_dict({name.removeprefix(_CRITIC): value for name, value
                                         in loaded["critic"].items()}, strict=False)
        state = loaded["optimizer"]
        for per_param in state["state"].values():
            per_param["step"] = torch.tensor(float(loaded["step"]))
        if isinstance(self.optimizer, DistributedAdamW):
            self.optimizer.load_full_state_dict(state)
        else:
            self.optimizer.load_state_dict(state)
        self.global_step = int(loaded["step"])
        self._load_extra_state(loaded.get("extra") or {})
        _log.info("megatron_resharded", directory=directory,
                  tensor_rank=ps.get_tensor_model_parallel_rank(),
                  pipeline_stage=ps.get_pipeline_model_parallel_rank())

    def _layout(self) -> dict[str, Any]:
        """This rank's place in the cut, as its checkpoint file records it."""
        from megatron.core import parallel_state as ps

        return {"backend": "megatron", "shape": dataclasses.asdict(self.shape),
                "tensor_parallel": self.megatron.tensor_parallel,
                "pipeline_parallel": self.megatron.pipeline_parallel,
                "data_parallel": self.data_parallel,
                "tensor_rank": ps.get_tensor_model_parallel_rank(),
                "pipeline_stage": ps.get_pipeline_model_parallel_rank(),
                "data_rank": ps.get_data_parallel_rank()}

    def _sharded_state(self) -> dict[str, Any]:
        """Model (and critic) and optimizer as megatron-core sharded tensors (the optimizer's
        moments sharded like their parameters, its step as one number)."""
        from megatron.core.dist_checkpointing.optimizer import (
            get_param_id_to_sharded_param_map,
            optim_state_to_sharding_state,
        )
        from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group

        gpt: Any = self.policy
        metadata = ensure_metadata_has_dp_cp_group(None)
        model = gpt.sharded_state_dict(metadata=metadata)
        if self._tied_embedding() is not None and not gpt.pre_process:
            # This stage's copy of the tied embedding is the first stage's, replicated.
            gpt.tie_embeddings_and_output_weights_state_dict(
                model, "output_layer.weight", "embedding.word_embeddings.weight", metadata)
        # The same per-parameter moments whichever optimizer wrote them, so a checkpoint
        # reshards across the optimizer and the data-parallel degree too.
        if isinstance(self.optimizer, DistributedAdamW):
            optimizer = self.optimizer.full_state_dict()
        else:
            _init_adam_state(self.optimizer)
            optimizer = self.optimizer.state_dict()
        state: dict[str, Any] = {"model": model}
        if self.critic is not None:
            critic: Any = self.critic
            state["critic"] = critic.sharded_state_dict(prefix=_CRITIC, metadata=metadata)
        mapping = get_param_id_to_sharded_param_map(state, self._trained_parameters())
        optim_state_to_sharding_state(optimizer, mapping, exclude_keys=("step",))
        state |= {"optimizer": optimizer, "step": self.global_step}
        extra = self._extra_state()
        # Only when there is some: a checkpoint written without the key loads as before.
        return state | {"extra": extra} if extra else state

    def offload(self) -> None:
        super().offload()
        if isinstance(self.optimizer, DistributedAdamW):
            self.optimizer.rebind()  # its pieces would keep the device storage alive

    def onload(self) -> None:
        super().onload()
        if isinstance(self.optimizer, DistributedAdamW):
            self.optimizer.rebind()

    def snapshot(self) -> dict[str, Any]:
        """This rank's shard of the trainable state, deep-copied."""
        import copy

        return {"modules": copy.deepcopy(self._modules().state_dict()),
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "step": self.global_step, "extra": self._extra_state()}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Back to a `snapshot` of this rank's shard."""
        self._modules().load_state_dict(snapshot["modules"])
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.global_step = int(snapshot["step"])
        self._load_extra_state(snapshot.get("extra", {}))

    def describe(self) -> dict[str, Any]:
        """The cut, for logs and the run summary."""
        from megatron.core import parallel_state as ps

        return dataclasses.asdict(self.megatron) | {
            "data_parallel": self.data_parallel,
            "optimizer_state_elements": sum(
                value.numel() for state in self.optimizer.state.values()
                for key, value in state.items() if key != "step"),
            "tensor_rank": ps.get_tensor_model_parallel_rank(),
            "pipeline_stage": ps.get_pipeline_model_parallel_rank(),
            "stage_parameters": sum(p.numel() for p in self.policy.parameters())}
