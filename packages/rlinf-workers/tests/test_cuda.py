"""The algorithms, log-prob function and actor-critic on a CUDA device (skipped without one)."""

from __future__ import annotations

import pytest
import torch

from rlinf.workers.algorithms import (
    bootstrap_next_values,
    broadcast_to_tokens,
    gae,
    grpo_advantages,
    kl_penalty,
    ppo_policy_loss,
    value_loss,
)
from rlinf.workers.models import (
    PolicyConfig,
    build_actor_critic,
    build_char_tokenizer,
    build_tiny_causal_lm,
    response_log_probs,
    response_mask_from_eos,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_algorithms_match_cpu_on_cuda() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(4, 16, generator=gen), torch.randn(4, 16, generator=gen)
    nv = bootstrap_next_values(values, torch.randn(4, generator=gen))
    done = torch.rand(4, 16, generator=gen) < 0.1
    cpu_adv, _ = gae(rewards, values, next_values=nv, gamma=0.99, lam=0.95, terminated=done)
    cuda_adv, _ = gae(rewards.cuda(), values.cuda(), next_values=nv.cuda(), gamma=0.99,
                      lam=0.95, terminated=done.cuda())
    torch.testing.assert_close(cuda_adv.cpu(), cpu_adv)
    mask = torch.ones(4, 16)
    token_adv = broadcast_to_tokens(grpo_advantages(rewards[:, 0], group_size=2), mask)
    lp = torch.randn(4, 16, generator=gen)
    cpu = ppo_policy_loss(lp, lp * 0.9, token_adv, mask, dual_clip=3.0)
    cuda = ppo_policy_loss(lp.cuda(), lp.cuda() * 0.9, token_adv.cuda(), mask.cuda(),
                           dual_clip=3.0)
    torch.testing.assert_close(cuda.loss.cpu(), cpu.loss)
    v = value_loss(values.cuda(), values.cuda(), rewards.cuda(), mask.cuda())
    assert v.clip_fraction.device.type == "cuda"
    assert kl_penalty(lp.cuda(), lp.cuda(), estimator="low-var-kl").abs().max().item() == 0.0


def test_log_probs_match_cpu_on_cuda() -> None:
    tok = build_char_tokenizer()
    model = build_tiny_causal_lm(seed=0, tokenizer=tok)
    prompts = tok(["1+1=", "12+7="], padding=True, return_tensors="pt")
    responses = torch.tensor([[6, 2, 0], [5, 13, 2]])
    batch = {"prompt_ids": prompts["input_ids"], "prompt_mask": prompts["attention_mask"],
             "response_ids": responses,
             "response_mask": response_mask_from_eos(responses, eos_token_id=2)}
    with torch.no_grad():
        cpu = response_log_probs(model, **batch)
        cuda = response_log_probs(model.cuda(), **{k: v.cuda() for k, v in batch.items()})
    torch.testing.assert_close(cuda.cpu(), cpu, atol=1e-4, rtol=1e-4)


def test_actor_critic_samples_on_cuda() -> None:
    policy = build_actor_critic(PolicyConfig(obs_shape=(5,), action_dim=2), seed=0).cuda()
    sample = policy.act(torch.zeros(3, 5, device="cuda"),
                        generator=torch.Generator(device="cuda").manual_seed(0))
    assert sample.action.device.type == "cuda"
    assert sample.log_prob.shape == (3,)
