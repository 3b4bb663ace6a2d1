"""A GRPO training step with DDP (gloo) across two Ray actors keeps their weights identical."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import ray
import torch

from rlinf.workers.algorithms import broadcast_to_tokens, grpo_advantages, ppo_policy_loss
from rlinf.workers.models import (
    build_char_tokenizer,
    build_tiny_causal_lm,
    response_log_probs,
    response_mask_from_eos,
)
from rlinf.workers.runtime import SCATTER_CONCAT, Worker, WorkerContext, WorkerGroup

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

GROUP_SIZE = 2


class GRPOTrainer(Worker):
    """One DDP replica of the tiny LM; each rank trains on its shard of whole groups."""

    def __init__(self, context: WorkerContext, *, seed: int) -> None:
        super().__init__(context)
        torch.set_num_threads(1)
        # a different init per rank: DDP must broadcast rank 0's weights at wrap time
        self.model = build_tiny_causal_lm(seed=seed + self.rank,
                                          tokenizer=build_char_tokenizer()).train()

    def setup(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self.ddp = DistributedDataParallel(self.model)
        self.optimizer = torch.optim.AdamW(self.ddp.parameters(), lr=1e-2)

    def parameters_vector(self) -> torch.Tensor:
        return torch.cat([p.detach().flatten() for p in self.model.parameters()])

    def train_step(self, batch: dict[str, torch.Tensor]) -> dict[str, list[float]]:
        mask = batch["response_mask"]
        log_probs = response_log_probs(
            self.ddp, prompt_ids=batch["prompt_ids"], prompt_mask=batch["prompt_mask"],
            response_ids=batch["response_ids"], response_mask=mask)
        advantages = broadcast_to_tokens(
            grpo_advantages(batch["rewards"], group_size=GROUP_SIZE), mask)
        loss = ppo_policy_loss(log_probs, log_probs.detach(), advantages, mask,
                               aggregation="seq-mean-token-mean").loss
        self.optimizer.zero_grad()
        loss.backward()  # DDP all-reduces (averages) the gradients across ranks here
        self.optimizer.step()
        return {"loss": [loss.item()]}


def _batch() -> dict[str, Any]:
    tok = build_char_tokenizer()
    prompts = tok(["1+1=", "1+1=", "12+7=", "12+7="], padding=True, return_tensors="pt")
    responses = tok(["2", "3", "19", "91"], padding="max_length", max_length=3,
                    padding_side="right", return_tensors="pt")["input_ids"]
    responses[responses == tok.pad_token_id] = tok.eos_token_id
    return {
        "prompt_ids": prompts["input_ids"], "prompt_mask": prompts["attention_mask"],
        "response_ids": responses,
        "response_mask": response_mask_from_eos(responses, eos_token_id=tok.eos_token_id),
        "rewards": torch.tensor([1.0, 0.0, 1.0, 0.0]),  # right answers first in each group
    }


@pytest.mark.timeout(300)
def test_ddp_grpo_step_keeps_replicas_identical(cluster: str) -> None:
    group = WorkerGroup.launch(GRPOTrainer, role="actor", num_ranks=2, num_cpus_per_rank=0.25,
                               init_kwargs={"seed": 0}, call_timeout=180)
    try:
        before = group.call("parameters_vector")
        assert not torch.equal(before[0], before[1])  # seeds differ per rank
        group.init_process_group(backend="gloo", timeout=120)
        group.call("setup")
        synced = group.call("parameters_vector")
        assert torch.equal(synced[0], synced[1])  # DDP broadcast rank 0's weights
        assert torch.equal(synced[0], before[0])
        # the batch is split by whole groups: rank 0 gets "1+1=", rank 1 gets "12+7="
        out = group.call("train_step", _batch(), spec=SCATTER_CONCAT)
        assert len(out["loss"]) == 2
        after = group.call("parameters_vector")
        assert torch.equal(after[0], after[1])  # gradients were averaged across ranks
        assert not torch.equal(after[0], synced[0])  # and a step was taken
    finally:
        group.shutdown()
