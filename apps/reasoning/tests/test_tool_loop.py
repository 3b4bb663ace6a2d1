"""The multi-turn tool loop on the shipped tool-calling warm start: the calculator answers
its calls between turns, the trainer's loss and KL leave the tools' tokens out, the trainer
scores the model's own tokens as the rollout did, and sandbox calls that break their
limits come back as error observations while the loop goes on."""

from __future__ import annotations

import time

import pytest
import torch
from rlinf_reasoning.warmstart import TOOLS_WARMSTART_DIR, load_warmstart

from rlinf.envs.math import GeneratorConfig, ProblemGenerator, format_prompt
from rlinf.envs.tools import SandboxLimits, ToolCall
from rlinf.workers.actor import ActorConfig, PolicyTrainer
from rlinf.workers.models import response_log_probs_and_entropy
from rlinf.workers.reward import RewardScorer
from rlinf.workers.rollout import HFRolloutEngine, RolloutBatch, SamplingConfig
from rlinf.workers.rollout.tool_loop import ToolLoop, ToolLoopConfig


def _loop(**config: object) -> tuple[ToolLoop, object]:
    model, tokenizer = load_warmstart(path=TOOLS_WARMSTART_DIR)
    engine = HFRolloutEngine(model, eos_token_id=int(tokenizer.eos_token_id),
                             pad_token_id=int(tokenizer.pad_token_id))
    return ToolLoop.build(engine, tokenizer, ToolLoopConfig(**config)), tokenizer  # type: ignore[arg-type]


def _batch(loop: ToolLoop, tokenizer: object, count: int = 32, *, seed: int = 0) -> RolloutBatch:
    problems = ProblemGenerator(GeneratorConfig.for_level(2)).generate(count, split="train")
    prompts = [tokenizer.encode(format_prompt(p, template="short"))  # type: ignore[attr-defined]
               for p in problems]
    samples = loop.generate(prompts, sampling=SamplingConfig(max_new_tokens=32, seed=seed))
    return RolloutBatch.from_samples(samples, answers=[p.answer for p in problems],
                                     group_size=4, pad_token_id=0)


def test_calls_are_answered_between_turns_and_recorded() -> None:
    loop, tokenizer = _loop(max_turns=2)
    batch = _batch(loop, tokenizer)
    assert batch.tool_mask is not None and batch.turns is not None
    called = batch.tool_calls.bool()  # type: ignore[union-attr]
    assert called.sum() >= batch.num_rows // 2  # the warm start has learned to call
    # A row that called took a second turn, and its observation is the tool's answer.
    assert (batch.turns[called] == 2).all() and (batch.turns[~called] == 1).all()
    row = int(called.nonzero()[0])
    tool_ids = batch.response_ids[row][batch.tool_mask[row]].tolist()
    text = tokenizer.decode(tool_ids)  # type: ignore[attr-defined]
    assert text.startswith("<result>") and text.endswith("</result>")
    written = tokenizer.decode(batch.response_ids[row][batch.loss_mask[row].bool()].tolist())  # type: ignore[attr-defined]
    call = written[:written.index("</calculator>") + len("</calculator>")]
    expression = call.removeprefix("<calculator>").removesuffix("</calculator>")
    assert loop.tools.call(ToolCall("calculator", {"expression": expression})).observation \
        in text
    # Tool tokens carry no rollout log-prob; the stats add up.
    assert (batch.rollout_log_probs[batch.tool_mask] == 0).all()
    assert loop.stats.tool_calls == int(batch.tool_calls.sum())  # type: ignore[union-attr]
    assert loop.stats.trajectories == batch.num_rows
    loop.shutdown()


def test_the_reward_reads_the_final_turn_not_the_tools_answer() -> None:
    loop, tokenizer = _loop(max_turns=2)
    batch = _batch(loop, tokenizer)
    texts = RewardScorer(tokenizer).decode(batch)  # type: ignore[arg-type]
    for text, tool_calls in zip(texts, batch.tool_calls.tolist(), strict=True):  # type: ignore[union-attr]
        assert ("<result>" not in text and "<calculator>" not in text) or not tool_calls
    loop.shutdown()


def _actor(model: torch.nn.Module, **overrides: object) -> PolicyTrainer:
    config = ActorConfig(parallelism="none", micro_batch_size=64, padding_free=False,
                         **overrides)  # type: ignore[arg-type]
    return PolicyTrainer(model, config=config)


def test_trainer_log_probs_equal_the_rollouts_on_the_models_own_tokens() -> None:
    loop, tokenizer = _loop(max_turns=2)
    batch = _batch(loop, tokenizer, 64, seed=3)
    model, _ = load_warmstart(path=TOOLS_WARMSTART_DIR)
    trainer = _actor(model).response_log_probs(batch)
    own = batch.loss_mask.bool()
    assert own.sum() > 0 and batch.tool_mask.any()  # type: ignore[union-attr]
    torch.testing.assert_close(trainer[own], batch.rollout_log_probs[own], atol=2e-4, rtol=0)
    loop.shutdown()


@pytest.mark.parametrize("masked", [True, False])
def test_the_loss_and_kl_have_no_gradient_on_tool_tokens(masked: bool) -> None:
    loop, tokenizer = _loop(max_turns=2)
    batch = _batch(loop, tokenizer, 32, seed=5)
    loop.shutdown()
    tool = batch.tool_mask
    assert tool is not None and tool.any()
    if not masked:  # the control: without the mask, the same tokens do get a gradient
        batch = batch.replace(tool_mask=torch.zeros_like(tool))
    rewards = torch.arange(batch.num_rows, dtype=torch.float32) % 3
    noise = 0.1 * torch.randn(batch.rollout_log_probs.shape,
                              generator=torch.Generator().manual_seed(0))
    batch = batch.replace(rewards=rewards,
                          ref_log_probs=(batch.rollout_log_probs + noise) * batch.response_mask)
    model, _ = load_warmstart(path=TOOLS_WARMSTART_DIR)
    actor = _actor(model, kl_coef=0.1, entropy_coef=0.01)
    data = actor._prepare(batch)
    log_probs, entropy = response_log_probs_and_entropy(
        actor.model, prompt_ids=data["prompt_ids"], prompt_mask=data["prompt_mask"],
        response_ids=data["response_ids"], response_mask=data["response_mask"],
        temperature=1.0, padding_free=False)
    log_probs.retain_grad()
    entropy.retain_grad()
    loss, metrics = actor._policy_terms(data, log_probs, entropy)
    loss.backward()
    assert metrics["kl"] > 0
    on_tools = log_probs.grad[tool].abs().sum() + entropy.grad[tool].abs().sum()  # type: ignore[index]
    on_model = log_probs.grad[batch.loss_mask.bool()].abs().sum()  # type: ignore[index]
    assert on_model > 0
    assert (on_tools == 0) if masked else (on_tools > 0)


@pytest.mark.timeout(120)
def test_sandbox_calls_that_break_limits_are_error_observations_and_the_loop_goes_on(
        tmp_path: object) -> None:
    limits = SandboxLimits(cpu_seconds=2.0, wall_seconds=4.0, memory_bytes=256 << 20,
                           output_bytes=64 << 10)
    loop, tokenizer = _loop(tools=("python", "calculator"), sandbox=limits, max_turns=2)
    hostile = {
        "infinite loop": "while True: pass",
        "fork bomb": "import os\nwhile True: os.fork()",
        "1 GB allocation": "x = bytearray(1 << 30)",
        "/etc/passwd": "print(open('/etc/passwd').read())",
        "socket": "import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)",
        "write outside scratch": "open('/tmp/rlinf-sandbox-escape.txt', 'w').write('x')",
        "100 MB print": "print('x' * (100 << 20))",
    }
    started = time.perf_counter()
    results = loop.call_tools([ToolCall("python", {"code": code}) for code in hostile.values()])
    elapsed = time.perf_counter() - started
    for case, result in zip(hostile, results, strict=True):
        assert not result.ok, case
        assert result.observation.startswith("[error]") or "[error]" in result.observation, case
        assert result.seconds <= limits.wall_seconds + 2.0, case
    assert elapsed < limits.wall_seconds + 6.0  # they ran side by side, each within its limit
    # ... and the loop goes on: the model's next batch still calls and gets answers.
    batch = _batch(loop, tokenizer, 8)
    assert int(batch.tool_calls.sum()) > 0  # type: ignore[union-attr]
    loop.shutdown()


def test_turns_continue_from_the_kept_cache_with_the_whole_contexts_results() -> None:
    outs = {}
    for reuse in (False, True):
        loop, tokenizer = _loop(max_turns=3, reuse_cache=reuse)
        outs[reuse] = _batch(loop, tokenizer, 32, seed=7)
        loop.shutdown()
    a, b = outs[False], outs[True]
    assert b.tool_calls.sum() > 0  # type: ignore[union-attr]
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.tool_mask, b.tool_mask)  # type: ignore[arg-type]
    torch.testing.assert_close(a.rollout_log_probs, b.rollout_log_probs, atol=2e-5, rtol=0)
