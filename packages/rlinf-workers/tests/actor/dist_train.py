"""One rank of a data-parallel actor run, launched as a subprocess by test_actor_dist.py.

Usage: python dist_train.py RANK WORLD_SIZE PORT MODE[,MODE...] OUT_DIR
For each mode (`config`; one process group, one launch: starting Python is the slow part),
builds the same tiny model and batch as the test, trains on this rank's shard (whole
groups) for two steps, and saves the full parameters gathered through the rollout buckets
to OUT_DIR/{parallelism}-rank{R}.pt, plus those of a checkpoint-resume check.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from rank_launch import join

from rlinf.workers.actor import ActorConfig, PolicyTrainer
from rlinf.workers.models import TinyLMConfig, build_char_tokenizer, build_tiny_causal_lm
from rlinf.workers.rollout import RolloutBatch, RolloutSample

CONFIG = TinyLMConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=128, attn_implementation="eager")
GROUP = 4


def make_batch() -> RolloutBatch:
    """A fixed batch of 2 groups x 4 responses of varying lengths, one rewarded per group."""
    gen = torch.Generator().manual_seed(0)
    samples = []
    for row in range(2 * GROUP):
        length = 2 + row % 3
        samples.append(RolloutSample(
            prompt_token_ids=tuple(torch.randint(4, 90, (3 + row % 2,), generator=gen).tolist()),
            response_token_ids=tuple(torch.randint(4, 90, (length,), generator=gen).tolist()),
            log_probs=tuple((-torch.rand(length, generator=gen) - 4.0).tolist()),
            finish_reason="length"))
    batch = RolloutBatch.from_samples(samples, answers=["0"] * 8, group_size=GROUP,
                                      pad_token_id=0)
    rewards = torch.zeros(8)
    rewards[[1, 6]] = 1.0
    return batch.replace(rewards=rewards)


def config(mode: str) -> ActorConfig:
    """``ddp``/``fsdp2``/``none`` train GRPO; a ``-ppo`` suffix trains PPO with its critic
    and advantages whitened over the whole batch."""
    parallelism, _, algorithm = mode.partition("-")
    return ActorConfig(parallelism=parallelism, lr=1e-2, micro_batch_size=1,  # type: ignore[arg-type]
                       aggregation="token-mean", max_grad_norm=1.0,
                       algorithm=algorithm or "grpo")  # type: ignore[arg-type]


def _full(actor: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {name: t.clone() for bucket in actor.state_dict_for_rollout(bucket_bytes=1 << 30)
            for name, t in bucket}


def main() -> None:
    rank, world, modes, out = join()
    batch = make_batch()
    rows = batch.num_rows // world
    shard = batch.select(slice(rank * rows, (rank + 1) * rows))
    for parallelism in modes:
        model = build_tiny_causal_lm(CONFIG, seed=0, tokenizer=build_char_tokenizer())
        actor = PolicyTrainer(model, config=config(parallelism))
        for _ in range(2):
            actor.train(shard)
        synced = {name: t.clone()
                  for bucket in actor.state_dict_for_rollout(bucket_bytes=20_000)
                  for name, t in bucket}
        # Checkpoint, take one more step; then resume a differently initialised actor from
        # the checkpoint and take the same step: both must land on the same parameters.
        actor.save_checkpoint(f"{out}/{parallelism}-ckpt")
        actor.train(shard)
        continued = _full(actor)
        fresh = build_tiny_causal_lm(CONFIG, seed=5, tokenizer=build_char_tokenizer())
        resumed = PolicyTrainer(fresh, config=config(parallelism))
        resumed.load_checkpoint(f"{out}/{parallelism}-ckpt")
        resumed.train(shard)
        torch.save({"params": synced, "continued": continued, "resumed": _full(resumed)},
                   f"{out}/{parallelism}-rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
