"""Each reasoning role on its own, built in this process (no Ray actors), wired by channels.

The channels live on a `TCPStore` this process serves, as a run's do; the roles' flow entries
(`rollout_step`, `reward_step`, `inference_step`, `train_step`) and weight export/receive
run exactly as they do inside a `rlinf.workers.flow.FlowRun`.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from rlinf.comm import TOKEN_ENV, Channel, Endpoint, TCPStore, new_token, token_env_value
from rlinf.envs.math import MathProblem, ProblemGenerator
from rlinf.sched import parse_placement
from rlinf.workers.actor import ActorConfig
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import FlowChannel, Sharding, StepContext
from rlinf.workers.flow.channels import rank_key, store_name
from rlinf.workers.models import TinyLMConfig, build_char_tokenizer, build_tiny_causal_lm
from rlinf.workers.reasoning import (
    ActorRole,
    InferenceRole,
    RewardRole,
    RoleSetup,
    RolloutRole,
    pack_group,
    unpack_group,
)
from rlinf.workers.reward import RewardConfig
from rlinf.workers.rollout import (
    HFRolloutEngine,
    RolloutBatch,
    RolloutGeneratorConfig,
    SamplingConfig,
)
from rlinf.workers.runtime import WorkerContext

CONFIG = TinyLMConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=128, attn_implementation="eager")
ROLLOUT = RolloutGeneratorConfig(group_size=4, groups_per_micro_batch=2,
                              sampling=SamplingConfig(max_new_tokens=4))
ROLES = ("rollout", "reward", "inference", "actor")


def tiny_model() -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    tokenizer = build_char_tokenizer()
    return build_tiny_causal_lm(CONFIG, seed=0, tokenizer=tokenizer), tokenizer


class Wiring:
    """A store, this process's endpoint and the channels of one test."""

    def __init__(self) -> None:
        self.token = new_token()
        store = TCPStore.serve(token=self.token)
        # The roles open the store by its address, with the run's token from the env.
        self.store_name = store_name(f"rlinf-test-{uuid.uuid4().hex[:8]}", store.address)
        self.endpoint = Endpoint(store=store, token=self.token).make_current()
        self.store = store
        self.channels: dict[str, Channel] = {}

    def setup(self) -> RoleSetup:
        return RoleSetup(model_factory=tiny_model, seed=7, io_timeout=60.0)

    def channel(self, src: str, dst: str, *, ranks: int = 1, groups_per_message: int = 1,
                sharding: Sharding = "round_robin") -> FlowChannel:
        """Create the channel ``src->dst`` (this process owns it) and describe it."""
        name = f"{self.store_name}/{src}->{dst}"
        self.channels[f"{src}->{dst}"] = Channel.create(name, store=self.store,
                                                        endpoint=self.endpoint)
        return FlowChannel(src=src, dst=dst, name=name, store=self.store_name,
                           consumer_ranks=ranks, sharding=sharding, unit=4,
                           items_per_message=4 * groups_per_message)

    def close(self) -> None:
        for channel in self.channels.values():
            channel.disconnect()
        self.endpoint.close()
        self.store.close()


@pytest.fixture
def wiring(monkeypatch: pytest.MonkeyPatch) -> Iterator[Wiring]:
    wires = Wiring()
    monkeypatch.setenv(TOKEN_ENV, token_env_value(wires.token))
    try:
        yield wires
    finally:
        wires.close()


@pytest.fixture(scope="module")
def problems() -> list[MathProblem]:
    return ProblemGenerator().generate(5)


def ctx(role: str, rank: int = 0, world: int = 1) -> WorkerContext:
    return WorkerContext(role=role, rank=rank, world_size=world, devices=(rank,), trace=True)


def step_ctx(step: int, groups: int, placement: str = "rollout,reward,inference,actor: 0",
             **ranks: int) -> StepContext:
    """Iteration `step` of `groups` groups of 4 on `placement`."""
    devices = 1 + max(int(c) for c in placement if c.isdigit())
    return StepContext(step=step, items=dict.fromkeys(ROLES, 4 * groups),
                       ranks={r: ranks.get(r, 1) for r in ROLES},
                       placement=parse_placement(placement, components=ROLES,
                                                 num_devices=devices),
                       sources=("rollout",))


def source(problems: Sequence[MathProblem]) -> Any:
    """A problem source that serves `problems` at every step."""
    return lambda step, groups: list(problems[:groups])


def rollout_role(wiring: Wiring, problems: Sequence[MathProblem], rank: int = 0,
                 world: int = 1) -> RolloutRole:
    return RolloutRole(ctx("rollout", rank, world), setup=wiring.setup(), config=ROLLOUT,
                       problems=source(problems))


def drain(channel: Channel, count: int, *, key: str, step: int) -> dict[int, RolloutBatch]:
    return dict(unpack_group(channel.get(key=key, timeout=60), step=step) for _ in range(count))


def test_rollout_groups_do_not_depend_on_how_many_ranks_generate_them(
        wiring: Wiring, problems: list[MathProblem]) -> None:
    out = wiring.channel("rollout", "reward")
    one = rollout_role(wiring, problems)
    stats = one.rollout_step(step_ctx(3, 5), output_channel=out)
    assert stats["groups"] == 5 and stats["responses"] == 20
    alone = drain(wiring.channels["rollout->reward"], 5, key=rank_key(0), step=3)
    # two ranks, each generating its micro-batches; groups go to reward rank index % 2
    two = dataclasses.replace(out, consumer_ranks=2)
    for rank in range(2):
        rollout_role(wiring, problems, rank, 2).rollout_step(step_ctx(3, 5, rollout=2),
                                                             output_channel=two)
    split = {**drain(wiring.channels["rollout->reward"], 3, key=rank_key(0), step=3),
             **drain(wiring.channels["rollout->reward"], 2, key=rank_key(1), step=3)}
    assert sorted(split) == sorted(alone) == list(range(5))
    for index in range(5):
        assert torch.equal(split[index].response_ids, alone[index].response_ids)
        torch.testing.assert_close(split[index].rollout_log_probs,
                                   alone[index].rollout_log_probs)
        assert split[index].answers == (problems[index].answer,) * 4
    # another step draws other samples
    one.rollout_step(step_ctx(4, 5), output_channel=out)
    other = drain(wiring.channels["rollout->reward"], 5, key=rank_key(0), step=4)
    assert any(not torch.equal(other[i].response_ids, alone[i].response_ids) for i in range(5))
    assert {s.name for s in one.drain_spans()} >= {"generate", "micro_batch"}
    with pytest.raises(ConfigError, match="problems="):
        RolloutRole(ctx("rollout"), setup=wiring.setup(), config=ROLLOUT).rollout_step(
            step_ctx(5, 5), output_channel=out)


def test_rollout_and_inference_compute_at_the_setups_precision(wiring: Wiring) -> None:
    setup = dataclasses.replace(wiring.setup(), precision="bf16")
    rollout = RolloutRole(ctx("rollout"), setup=setup, config=ROLLOUT)
    assert isinstance(rollout.worker.engine, HFRolloutEngine)
    assert rollout.worker.engine.precision == "bf16"
    inference = InferenceRole(ctx("inference"), setup=setup, temperature=1.0, reference=True)
    assert inference.policy is not None and inference.reference is not None
    assert inference.policy.config.precision == inference.reference.config.precision == "bf16"
    with pytest.raises(ConfigError, match="precision"):
        dataclasses.replace(setup, precision="fp16")


def test_reward_and_inference_annotate_each_group_and_route_it_on(
        wiring: Wiring, problems: list[MathProblem]) -> None:
    step = step_ctx(0, 4, actor=2)
    to_reward = wiring.channel("rollout", "reward", groups_per_message=2)
    to_inference = wiring.channel("reward", "inference")
    to_actor = wiring.channel("inference", "actor", ranks=2, sharding="contiguous")
    rollout_role(wiring, problems).rollout_step(step, output_channel=to_reward)
    reward = RewardRole(ctx("reward"), setup=wiring.setup(),
                        config=RewardConfig(format_penalty=1.0))
    totals = reward.reward_step(step, input_channel=to_reward, output_channel=to_inference)
    assert totals["responses"] == 16 and totals["groups"] == 4
    assert -16 <= totals["reward_sum"] <= 16 and 0 <= totals["correct"] <= 16
    assert totals["accuracy"] == pytest.approx(totals["correct"] / 16)
    inference = InferenceRole(ctx("inference"), setup=wiring.setup(), temperature=1.0,
                              reference=True)
    assert inference.inference_step(step, input_channel=to_inference,
                                    output_channel=to_actor) == {"groups": 4.0}
    channel = wiring.channels["inference->actor"]
    first, second = (drain(channel, 2, key=rank_key(r), step=0) for r in range(2))
    assert sorted(first) == [0, 1] and sorted(second) == [2, 3]  # contiguous actor shards
    for group in {**first, **second}.values():
        assert group.rewards is not None and group.old_log_probs is not None
        # same weights everywhere: recomputed and reference log-probs equal the rollout's
        torch.testing.assert_close(group.old_log_probs, group.rollout_log_probs,
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(group.ref_log_probs, group.rollout_log_probs,
                                   atol=1e-5, rtol=0)


def test_actor_orders_groups_trains_and_its_weights_reach_the_rollout(
        wiring: Wiring, problems: list[MathProblem]) -> None:
    step = step_ctx(1, 4)
    to_reward = wiring.channel("rollout", "reward")
    to_actor = wiring.channel("reward", "actor", groups_per_message=3, sharding="contiguous")
    rollout = rollout_role(wiring, problems)
    rollout.rollout_step(step, output_channel=to_reward)
    RewardRole(ctx("reward"), setup=wiring.setup(), config=RewardConfig(format_penalty=1.0)
               ).reward_step(dataclasses.replace(step, items={**step.items}),
                             input_channel=to_reward, output_channel=to_actor)
    actor = ActorRole(ctx("actor"), setup=wiring.setup(),
                      config=ActorConfig(parallelism="none", lr=1e-2, micro_batch_size=8),
                      bucket_bytes=16_000)
    with pytest.raises(ConfigError, match="build"):
        actor.train_step(step, input_channel=to_actor)
    actor.build()
    with pytest.raises(ConfigError, match="contiguous"):
        actor.train_step(step, input_channel=to_reward)
    metrics = actor.train_step(step, input_channel=to_actor)
    assert metrics["grad_norm"] > 0
    # collocated with the rollout, the actor trains its collected shard in one turn
    names = {s.name for s in actor.drain_spans()}
    assert "train" in names and "train_micro_batch" not in names

    probe = rollout.generate_batch(problems[:2], sampling=SamplingConfig(max_new_tokens=4,
                                                                         seed=1))
    assert (actor.log_probs(probe) - probe.rollout_log_probs).abs().max() > 1e-3  # stale
    handles = actor.export_weights("shm")
    assert len(handles) > 1  # several buckets
    assert rollout.receive_weights("shm", handles) == len(handles)
    actor.release_weights(handles)
    probe = rollout.generate_batch(problems[:2], sampling=SamplingConfig(max_new_tokens=4,
                                                                         seed=1))
    torch.testing.assert_close(actor.log_probs(probe), probe.rollout_log_probs,
                               atol=1e-5, rtol=0)
    actor.shutdown()
    rollout.shutdown()


def test_profile_train_leaves_the_trainer_unchanged(
        wiring: Wiring, problems: list[MathProblem]) -> None:
    rollout = RolloutRole(ctx("rollout"), setup=wiring.setup(), config=ROLLOUT)
    reward = RewardRole(ctx("reward"), setup=wiring.setup(), config=RewardConfig(
        format_penalty=1.0))
    batch = reward.score(rollout.generate_batch(problems[:2], sampling=SamplingConfig(
        max_new_tokens=4, seed=3)))
    actor = ActorRole(ctx("actor"), setup=wiring.setup(),
                      config=ActorConfig(parallelism="none", lr=1e-2))
    actor.build()
    before = {k: v.clone() for k, v in actor.actor.model.state_dict().items()}
    assert actor.profile_train(batch) > 0
    after = actor.actor.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert actor.actor.global_step == 0


def record_steps(optimizer: torch.optim.Optimizer, out: list[torch.Tensor]) -> None:
    """Make `optimizer.step` first append a copy of every gradient to `out`."""
    step = optimizer.step

    def recording(*args: Any, **kwargs: Any) -> Any:
        out.extend(p.grad.clone() for g in optimizer.param_groups for p in g["params"]
                   if p.grad is not None)
        return step(*args, **kwargs)

    optimizer.step = recording  # type: ignore[method-assign]


def test_streamed_training_steps_like_training_on_the_whole_shard(
        wiring: Wiring, problems: list[MathProblem]) -> None:
    """Micro-batch gradients accumulated as groups arrive, one step at the end, give the
    update of `PolicyTrainer.train` on the collected shard (up to float summation order)."""
    apart = step_ctx(2, 5, "rollout: 0, reward,inference,actor: 1")  # the actor streams
    to_reward = wiring.channel("rollout", "reward")
    to_actor = wiring.channel("reward", "actor", groups_per_message=2, sharding="contiguous")
    rollout_role(wiring, problems).rollout_step(apart, output_channel=to_reward)
    reward = RewardRole(ctx("reward"), setup=wiring.setup(),
                        config=RewardConfig(format_penalty=1.0))
    reward.reward_step(apart, input_channel=to_reward, output_channel=to_actor)
    arrived = drain(wiring.channels["reward->actor"], 5, key=rank_key(0), step=2)
    config = ActorConfig(parallelism="none", lr=1e-2, micro_batch_size=8)
    streamed, whole = (ActorRole(ctx("actor"), setup=wiring.setup(), config=config)
                       for _ in range(2))
    streamed.build()
    whole.build()
    # the gradient each optimizer step applies
    grads: dict[int, list[torch.Tensor]] = {id(streamed): [], id(whole): []}
    for role in (streamed, whole):
        record_steps(role.actor.optimizer, grads[id(role)])
    channel = wiring.channels["reward->actor"]
    for index in (3, 0, 4, 2, 1):  # out of order: the actor waits for consecutive groups
        channel.put(pack_group(arrived[index], index=index, step=2), weight=4, key=rank_key(0))
    metrics = streamed.train_step(apart, input_channel=to_actor)
    assert {s.name for s in streamed.drain_spans()} >= {"train_micro_batch", "optimizer_step"}
    reference = whole.train_batch(RolloutBatch.concat([arrived[i] for i in range(5)],
                                                      pad_token_id=0))
    for key in ("policy_loss", "entropy", "grad_norm"):
        assert metrics[key] == pytest.approx(reference[key], rel=1e-4, abs=1e-6), key
    assert len(grads[id(streamed)]) == len(grads[id(whole)]) > 0
    for a, b in zip(grads[id(streamed)], grads[id(whole)], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    assert streamed.actor.global_step == whole.actor.global_step == 1


@pytest.mark.parametrize("placement", ["rollout: 0, reward,inference,actor: 1",  # streams
                                       "rollout,reward,inference,actor: 0"])  # collects
def test_a_lagging_trainer_recomputes_the_old_log_probs_under_its_own_weights(
        wiring: Wiring, problems: list[MathProblem], placement: str) -> None:
    """policy_lag=1: the responses were sampled by weights one update old; the trainer
    clips around its own policy before the update (log-probs it recomputes) and weighs
    each token against the sampling policy by the rollout correction."""
    lagged_ctx = step_ctx(2, 4, placement)
    to_reward = wiring.channel("rollout", "reward")
    to_actor = wiring.channel("reward", "actor", groups_per_message=2, sharding="contiguous")
    rollout_role(wiring, problems).rollout_step(lagged_ctx, output_channel=to_reward)
    RewardRole(ctx("reward"), setup=wiring.setup(), config=RewardConfig(
        format_penalty=1.0)).reward_step(lagged_ctx, input_channel=to_reward,
                                          output_channel=to_actor)
    arrived = drain(wiring.channels["reward->actor"], 4, key=rank_key(0), step=2)
    config = ActorConfig(parallelism="none", lr=1e-2, micro_batch_size=8, policy_lag=1,
                         rollout_correction_cap=2.0)
    lagged, reference = (ActorRole(ctx("actor"), setup=wiring.setup(), config=config)
                         for _ in range(2))
    lagged.build()
    reference.build()
    for role in (lagged, reference):  # the trainer one update ahead of the sampler
        with torch.no_grad():
            for p in role.actor.model.parameters():
                p.add_(0.01 * torch.sin(torch.arange(p.numel(), dtype=p.dtype)).view_as(p))
    grads: dict[int, list[torch.Tensor]] = {id(lagged): [], id(reference): []}
    for role in (lagged, reference):
        record_steps(role.actor.optimizer, grads[id(role)])
    batch = RolloutBatch.concat([arrived[i] for i in range(4)], pad_token_id=0)
    proximal = reference.log_probs(batch)
    assert not torch.allclose(proximal, batch.rollout_log_probs, atol=1e-3)
    channel = wiring.channels["reward->actor"]
    for index in range(4):
        channel.put(pack_group(arrived[index], index=index, step=2), weight=4, key=rank_key(0))
    metrics = lagged.train_step(lagged_ctx, input_channel=to_actor)
    want = reference.train_batch(dataclasses.replace(batch, old_log_probs=proximal))
    for key in ("policy_loss", "rollout_correction_weight", "approx_kl", "grad_norm"):
        assert metrics[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    assert metrics["rollout_correction_weight"] != pytest.approx(1.0, abs=1e-4)
    assert len(grads[id(lagged)]) == len(grads[id(reference)]) > 0
    for a, b in zip(grads[id(lagged)], grads[id(reference)], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def sdpa_model() -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """The tiny model with transformers' default kernel (sdpa), as loaded models have."""
    tokenizer = build_char_tokenizer()
    return build_tiny_causal_lm(dataclasses.replace(CONFIG, attn_implementation="sdpa"),
                                seed=0, tokenizer=tokenizer), tokenizer


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_bf16_on_policy_first_step_has_a_ratio_of_exactly_one(
        wiring: Wiring, problems: list[MathProblem], algorithm: str) -> None:
    """The inference role recomputes the old log-probs with the kernel the actor trains
    with ("auto": eager in bf16 on CPU), so the trainer's first ratio is 1 bit for bit: no
    token clipped, no KL between the two passes."""
    setup = dataclasses.replace(wiring.setup(), model_factory=sdpa_model, precision="bf16")
    rollout = RolloutRole(ctx("rollout"), setup=setup, config=ROLLOUT)
    reward = RewardRole(ctx("reward"), setup=setup, config=RewardConfig(format_penalty=1.0))
    batch = reward.score(rollout.generate_batch(problems[:4], sampling=SamplingConfig(
        max_new_tokens=4, seed=5)))
    config = ActorConfig(algorithm=algorithm, parallelism="none", lr=1e-2,  # type: ignore[arg-type]
                         micro_batch_size=8, precision="bf16", dual_clip=3.0)
    inference = InferenceRole(ctx("inference"), setup=setup, temperature=1.0,
                              micro_batch_size=config.micro_batch_size,
                              attention=config.attention)
    actor = ActorRole(ctx("actor"), setup=setup, config=config)
    actor.build()
    inference.onload()
    old = inference.log_probs(batch)
    assert old.old_log_probs is not None
    # the actor's own forward under its training kernel gives the same bits
    assert torch.equal(actor.log_probs(batch), old.old_log_probs)
    metrics = actor.train_batch(old)
    assert metrics["clip_fraction"] == metrics["dual_clip_fraction"] == 0.0
    assert metrics["approx_kl"] == 0.0
    # the model's own kernel (sdpa), as inference ran before, is another ~1e-3 away
    other = InferenceRole(ctx("inference"), setup=setup, temperature=1.0, attention="model")
    other.onload()
    assert other.log_probs(batch).old_log_probs is not None
    assert not torch.equal(other.log_probs(batch).old_log_probs, old.old_log_probs)
    for role in (rollout, reward, inference, other, actor):
        role.shutdown()


def test_a_policy_lag_needs_the_rollout_correction() -> None:
    with pytest.raises(ConfigError, match="rollout_correction_cap"):
        ActorConfig(policy_lag=1)
    with pytest.raises(ConfigError, match="policy_lag must be 0 or 1"):
        ActorConfig(policy_lag=2, rollout_correction_cap=2.0)


def test_a_setup_loads_its_tokenizer_from_the_tokenizer_factory_when_given() -> None:
    built: list[str] = []

    def model_factory() -> Any:
        built.append("model")
        return object(), "model's tokenizer"

    def tokens() -> Any:
        built.append("tokenizer")
        return "tokenizer alone"

    assert RoleSetup(model_factory=model_factory).tokenizer() == "model's tokenizer"
    with_tokens = RoleSetup(model_factory=model_factory, tokenizer_factory=tokens)
    assert with_tokens.tokenizer() == "tokenizer alone"
    assert built == ["model", "tokenizer"]


def test_held_out_evaluation_answers_in_the_rollout_and_scores_in_the_reward_role(
        wiring: Wiring, problems: list[MathProblem]) -> None:
    rollout = rollout_role(wiring, problems)
    first = rollout.greedy_batch(problems[:3], max_new_tokens=4)
    second = rollout.greedy_batch(problems[3:], max_new_tokens=4)
    assert first is not None and second is not None
    assert (first.num_rows, second.num_rows) == (3, 2)  # one greedy answer per problem
    again = rollout.greedy_batch(problems[:3], max_new_tokens=4)
    assert again is not None and torch.equal(again.response_ids, first.response_ids)
    assert rollout.greedy_batch([], max_new_tokens=4) is None
    reward = RewardRole(ctx("reward"), setup=wiring.setup(), config=RewardConfig())
    correct, answered, samples = reward.evaluate([first, None, second], samples=4)
    expected = [reward.worker.compute_rewards(batch)[1] for batch in (first, second)]
    assert answered == 5
    assert correct == pytest.approx(sum(s.accuracy * s.responses for s in expected))
    assert reward.evaluate([]) == (0.0, 0, [])
    # the first 4 responses across batches, as the model saw and wrote them, with rewards
    tokenizer = reward.worker.tokenizer
    assert [s["answer"] for s in samples] == [p.answer for p in problems[:4]]
    assert samples[3]["prompt"] == tokenizer.decode(
        [t for t, m in zip(second.prompt_ids[0].tolist(), second.prompt_mask[0].tolist(),
                           strict=True) if m])
    assert samples[0]["response"] == reward.worker.decode(first)[0]
    scored = reward.worker.compute_rewards(first)[0]
    assert samples[0]["reward"] == pytest.approx(float(scored.rewards[0]))
    assert reward.evaluate([first], samples=0)[2] == []
