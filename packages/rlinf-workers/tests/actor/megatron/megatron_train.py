"""One rank of a Megatron actor run, launched as a subprocess by test_megatron_actor.py.

Usage: python megatron_train.py RANK WORLD_SIZE PORT MODE[,MODE...] OUT_DIR
(``RLINF_MEGATRON_DEVICE=cuda``: NCCL, one GPU per rank.)
A mode is ``tp{T}-pp{P}`` plus optional ``-untied`` (separate output head), ``-sp``
(sequence parallelism), ``-dopt`` (distributed optimizer) and ``-ppo`` (PPO with its critic,
advantages whitened over the batch; GRPO otherwise). For each mode: build the tiny model of
dist_train.py, cut it, record the log-probs of the batch, train two steps on this rank's
data-parallel shard, and save the gathered Hugging Face parameters and the metrics (and
with PPO the critic's values of the batch before and after) to OUT_DIR/{mode}-rank{R}.pt.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from dist_train import CONFIG, config, make_batch
from rank_launch import join

from rlinf.workers.actor import PolicyTrainer
from rlinf.workers.actor.megatron import (
    DistributedAdamW,
    MegatronActor,
    MegatronConfig,
    hf_policy_from_checkpoint,
    shards_to_hf,
)
from rlinf.workers.models import build_char_tokenizer, build_tiny_causal_lm

RESHARD = {"tp2-pp1": "tp1-pp2", "tp1-pp2": "tp2-pp1", "tp1-pp2-untied": "tp2-pp1-untied",
           "tp2-pp1-sp": "tp1-pp1-dopt", "tp1-pp1-dopt": "tp2-pp1",
           "tp1-pp2-ppo": "tp2-pp1-sp-ppo"}
"""Modes whose checkpoint is also loaded by the other cut of two ranks."""


def algorithm(mode: str) -> str:
    """dist_train's config mode of a mode name (`config`)."""
    return "none-ppo" if mode.endswith("-ppo") else "none"


def parse(mode: str) -> tuple[MegatronConfig, bool]:
    """(cut, tied embeddings) of a mode name."""
    parts = mode.split("-")
    tp = int(parts[0].removeprefix("tp"))
    pp = int(parts[1].removeprefix("pp"))
    return (MegatronConfig(tensor_parallel=tp, pipeline_parallel=pp,
                           sequence_parallel="sp" in parts,
                           distributed_optimizer="dopt" in parts), "untied" not in parts)


def build_model(tied: bool, *, seed: int = 0) -> torch.nn.Module:
    return build_tiny_causal_lm(dataclasses.replace(CONFIG, tie_word_embeddings=tied),
                                seed=seed, tokenizer=build_char_tokenizer())


def gathered(actor: MegatronActor, *, bucket_bytes: int = 1 << 30) -> dict[str, torch.Tensor]:
    """The Hugging Face parameters `state_dict_for_rollout` assembles (empty on ranks that
    do not root a model-parallel group)."""
    return {name: t.clone() for bucket in actor.state_dict_for_rollout(bucket_bytes=bucket_bytes)
            for name, t in bucket}


def capture_gradients(actor: PolicyTrainer) -> dict[str, torch.Tensor]:
    """This rank's gradients as its first optimizer step sees them (clipped), by name (an
    `PolicyTrainer`'s policy, or a `MegatronActor`'s stage); filled when that step runs."""
    captured: dict[str, torch.Tensor] = {}
    step = actor.optimizer.step

    def capturing(*args: object, **kwargs: object) -> object:
        if not captured:
            captured.update({name: p.grad.clone() for name, p in actor.policy.named_parameters()
                             if p.grad is not None})
            if isinstance(actor.optimizer, DistributedAdamW):
                captured.update(_pieces_of_gradients(actor))
        return step(*args, **kwargs)

    actor.optimizer.step = capturing  # type: ignore[method-assign]
    return captured


def _pieces_of_gradients(actor: PolicyTrainer) -> dict[str, torch.Tensor]:
    """A distributed optimizer's gradients of the policy by parameter name: this rank's
    range, zeros elsewhere (the data-parallel ranks' captures add up to the whole gradient;
    the critic's parameters follow the policy's in the optimizer)."""
    optimizer = actor.optimizer
    assert isinstance(optimizer, DistributedAdamW)
    names = [name for name, _ in actor.policy.named_parameters()]
    partial = {name: torch.zeros_like(p) for name, p in actor.policy.named_parameters()}
    for view, piece in zip(optimizer.views, optimizer.pieces, strict=True):
        assert view.grad is not None
        if piece.index < len(names):
            partial[names[piece.index]].view(-1)[piece.start: piece.stop] = view.grad
    return partial


def gathered_gradients(local: dict[str, torch.Tensor],
                       actor: MegatronActor) -> dict[str, torch.Tensor]:
    """Every shard's gradients in Hugging Face names on rank 0 (empty elsewhere)."""
    from megatron.core import parallel_state as ps

    mine = (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank(),
            ps.get_data_parallel_rank(), local)
    every: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if dist.get_rank() != 0:
        return {}
    if isinstance(actor.optimizer, DistributedAdamW):
        # Each data-parallel rank captured its range of the summed gradient: add them up.
        summed: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        for stage, tp_rank, _, grads in every:  # type: ignore[misc]
            into = summed.setdefault((stage, tp_rank), {})
            for name, grad in grads.items():
                into[name] = into[name] + grad if name in into else grad.clone()
        every = [(stage, tp_rank, 0, grads) for (stage, tp_rank), grads in summed.items()]
    return shards_to_hf(((stage, tp_rank, grads)
                         for stage, tp_rank, dp_rank, grads in every  # type: ignore[misc]
                         if dp_rank == 0), actor.shape,
                        tensor_parallel=actor.megatron.tensor_parallel,
                        pipeline_parallel=actor.megatron.pipeline_parallel)


def sequence_split(actor: MegatronActor, batch: object) -> float:
    """How many pieces the first layer's norm sees the sequence in (tensor-parallel degree
    under sequence parallelism, else 1), from one forward of `batch`."""
    seen: dict[str, int] = {}
    gpt = actor.policy
    norm = gpt.decoder.layers[0].input_layernorm  # type: ignore[union-attr, index]

    def on_norm(_module: object, args: tuple[torch.Tensor, ...], _out: object) -> None:
        seen.setdefault("norm", args[0].shape[0])

    def on_model(_module: object, args: tuple[torch.Tensor, ...]) -> None:
        seen.setdefault("tokens", args[0].shape[1])

    hooks = [norm.register_forward_hook(on_norm), gpt.register_forward_pre_hook(on_model)]
    actor.response_log_probs(batch)  # type: ignore[arg-type]
    for hook in hooks:
        hook.remove()
    return seen["tokens"] / seen["norm"]


def main() -> None:
    device = os.environ.get("RLINF_MEGATRON_DEVICE", "cpu")
    rank, _, modes, out = join("nccl" if device == "cuda" else "gloo")
    from megatron.core import parallel_state as ps

    batch = make_batch()
    for mode in modes:
        cut, tied = parse(mode)
        actor = MegatronActor(build_model(tied), config=config(algorithm(mode)), megatron=cut,
                              device=device)
        replicas = actor.data_parallel
        rows = batch.num_rows // replicas
        index = ps.get_data_parallel_rank()
        shard = batch.select(slice(index * rows, (index + 1) * rows))
        log_probs = actor.response_log_probs(batch)
        ppo = actor.critic is not None
        values = [actor.response_values(batch)] if ppo else []
        split = sequence_split(actor, batch)
        first_step = capture_gradients(actor)
        metrics = [actor.train(shard) for _ in range(2)]
        if ppo:
            values.append(actor.response_values(batch))
        grads = gathered_gradients(first_step, actor)
        params = gathered(actor, bucket_bytes=20_000)
        # Checkpoint, take one more step; resume a differently initialised actor from the
        # checkpoint and take the same step: both must land on the same parameters.
        actor.save_checkpoint(f"{out}/{mode}-ckpt")
        dist.barrier()  # every rank's file is written
        exported = hf_policy_from_checkpoint(f"{out}/{mode}-ckpt") if rank == 0 else {}
        actor.train(shard)
        continued = gathered(actor)
        fresh = MegatronActor(build_model(tied, seed=5), config=config(algorithm(mode)),
                              megatron=cut, device=device)
        fresh.load_checkpoint(f"{out}/{mode}-ckpt")
        fresh.train(shard)
        resumed = gathered(fresh)
        describe = actor.describe()
        # The same checkpoint into another cut of two ranks (TP=2 <-> PP=2, and between
        # the distributed optimizer on two data-parallel replicas and TP=2), resharded from
        # the distributed checkpoint. The new cut trains on the same rows: its
        # model-parallel group gathers them, as the flow's `training_batch` does (two
        # replicas of a batch weigh as the batch itself).
        other = RESHARD.get(mode)
        resharded: dict[str, torch.Tensor] = {}
        if other is not None:
            moved = MegatronActor(build_model(tied, seed=7), config=config(algorithm(mode)),
                                  megatron=parse(other)[0], device=device)
            moved.load_checkpoint(f"{out}/{mode}-ckpt")
            moved.train(moved.training_batch(shard, pad_token_id=0)
                        if moved.data_parallel < replicas else shard)
            resharded = gathered(moved)
        torch.save({"log_probs": log_probs, "metrics": metrics, "params": params,
                    "continued": continued, "resumed": resumed, "exported": exported,
                    "resharded": resharded, "describe": describe, "grads": grads,
                    "values": values,
                    "sequence_split": split},
                   f"{out}/{mode}-rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
