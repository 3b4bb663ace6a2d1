from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from rlinf.comm import Batch
from rlinf.comm._internal.codec import decode, encode
from rlinf.workers.errors import ConfigError
from rlinf.workers.rollout import (
    GroupSink,
    HFRolloutEngine,
    RolloutBatch,
    RolloutGenerator,
    RolloutGeneratorConfig,
    SamplingConfig,
)


@dataclass
class RecordingEngine:
    """Delegates to a real engine and records the order of calls (for streaming checks)."""

    inner: HFRolloutEngine
    events: list[str] = field(default_factory=list)

    def generate(self, prompt_token_ids: Any, *, sampling: SamplingConfig) -> Any:
        self.events.append(f"generate:{len(prompt_token_ids)}")
        return self.inner.generate(prompt_token_ids, sampling=sampling)

    def update_weights(self, named_tensors: Any) -> None:
        self.inner.update_weights(named_tensors)

    def offload(self) -> None:
        self.inner.offload()

    def onload(self) -> None:
        self.inner.onload()


@dataclass
class WeightedSink:
    """A queue-like sink with the Channel's put signature."""

    items: list[tuple[Any, float]] = field(default_factory=list)

    def put(self, item: Any, *, weight: float = 1) -> None:
        self.items.append((item, weight))


def _worker(model, tokenizer, **config: Any) -> tuple[RolloutGenerator, RecordingEngine]:
    engine = RecordingEngine(HFRolloutEngine(model, eos_token_id=tokenizer.eos_token_id,
                                             pad_token_id=tokenizer.pad_token_id))
    cfg = RolloutGeneratorConfig(sampling=SamplingConfig(max_new_tokens=5, seed=0), **config)
    return RolloutGenerator(engine, tokenizer, config=cfg), engine


def test_groups_stream_out_after_each_micro_batch(model, tokenizer, problems):
    worker, engine = _worker(model, tokenizer, group_size=3, groups_per_micro_batch=2)

    def sink(group: RolloutBatch) -> None:
        engine.events.append(f"group:{group.answers[0]}")

    stats = worker.rollout(problems[:5], sink=sink)
    answers = [p.answer for p in problems[:5]]
    assert engine.events == [
        "generate:6", f"group:{answers[0]}", f"group:{answers[1]}",
        "generate:6", f"group:{answers[2]}", f"group:{answers[3]}",
        "generate:3", f"group:{answers[4]}",
    ]
    assert (stats.groups, stats.responses) == (5, 15)
    assert 5 <= stats.response_tokens <= 15 * 5


def test_group_rows_share_the_prompt_and_answer(model, tokenizer, problems):
    worker, _ = _worker(model, tokenizer, group_size=4, groups_per_micro_batch=3)
    batch = worker.generate_batch(problems[:3])
    assert batch.num_rows == 12 and batch.group_size == 4
    for g, problem in enumerate(problems[:3]):
        rows = slice(4 * g, 4 * g + 4)
        prompt = worker.encode_prompt(problem)
        for ids, mask in zip(batch.prompt_ids[rows], batch.prompt_mask[rows], strict=True):
            assert ids[mask.bool()].tolist() == prompt
        assert set(batch.answers[rows]) == {problem.answer}
    # sampling differs within a group (4 draws of 5 tokens from ~100 ids)
    assert len({tuple(r.tolist()) for r in batch.response_ids[:4]}) > 1


def test_queue_sink_receives_channel_batches_that_round_trip_the_codec(model, tokenizer,
                                                                        problems):
    worker, _ = _worker(model, tokenizer, group_size=2, groups_per_micro_batch=2)
    sink = WeightedSink()
    assert isinstance(sink, GroupSink)
    worker.rollout(problems[:3], sink=sink)
    assert [w for _, w in sink.items] == [2, 2, 2]
    item, _ = sink.items[0]
    assert isinstance(item, Batch)
    restored = RolloutBatch.from_batch(decode(encode(item), to="torch"))
    original = RolloutBatch.from_batch(item)
    for name in ("prompt_ids", "response_ids", "response_mask", "rollout_log_probs", "stopped"):
        assert torch.equal(getattr(restored, name), getattr(original, name))
    assert restored.answers == (problems[0].answer,) * 2


def test_concat_repads_and_select_keeps_groups(model, tokenizer, problems):
    worker, _ = _worker(model, tokenizer, group_size=2, groups_per_micro_batch=1)
    groups: list[RolloutBatch] = []
    worker.rollout(problems[:3], sink=groups.append)
    merged = RolloutBatch.concat(groups, pad_token_id=tokenizer.pad_token_id)
    assert merged.num_rows == 6
    for g, group in enumerate(groups):
        part = merged.select(slice(2 * g, 2 * g + 2))
        assert torch.equal(part.prompt_ids[part.prompt_mask.bool()],
                           group.prompt_ids[group.prompt_mask.bool()])
        width = group.response_ids.shape[1]
        assert torch.equal(part.rollout_log_probs[:, :width], group.rollout_log_probs)
    with pytest.raises(ConfigError, match="whole groups"):
        merged.select(slice(1, 3))


def test_worker_offload_and_onload_reach_the_engine(model, tokenizer, problems):
    worker, _ = _worker(model, tokenizer)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    worker.offload()
    worker.onload()
    worker.update_weights(state.items())
    assert worker.generate_batch(problems[:1]).num_rows == 4


def test_bad_config_and_sink_are_rejected(model, tokenizer, problems):
    with pytest.raises(ConfigError):
        RolloutGeneratorConfig(group_size=0)
    worker, _ = _worker(model, tokenizer)
    with pytest.raises(ConfigError, match="sink"):
        worker.rollout(problems[:1], sink=42)  # type: ignore[arg-type]


CHAT_TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}[assistant]{% endif %}")


def test_chat_template_renders_prompts_through_the_tokenizer(model, problems) -> None:
    from rlinf.envs.math import format_chat
    from rlinf.workers.models import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    worker, _ = _worker(model, tokenizer, template="chat")
    ids = worker.encode_prompt(problems[0])
    system, user = (m["content"] for m in format_chat(problems[0]))
    expected = f"[system]{system}\n[user]{user}\n[assistant]"
    assert ids == list(tokenizer(expected, add_special_tokens=False)["input_ids"])
    assert tokenizer.decode(ids) == expected
    # The plain text form ("System: ...") is not what a chat model was trained on.
    assert "System:" not in tokenizer.decode(ids)


def test_chat_template_without_one_in_the_tokenizer_is_refused(model, tokenizer) -> None:
    assert not getattr(tokenizer, "chat_template", None)
    with pytest.raises(ConfigError, match="template 'plain'"):
        _worker(model, tokenizer, template="chat")


def test_problems_travel_with_their_groups_only_when_asked(model, tokenizer, problems):
    plain, _ = _worker(model, tokenizer, group_size=2, groups_per_micro_batch=2)
    assert plain.generate_batch(problems[:2]).prompts == ()
    worker, _ = _worker(model, tokenizer, group_size=2, groups_per_micro_batch=2,
                        problem_columns=True)
    sink = WeightedSink()
    worker.rollout(problems[:3], sink=sink)
    groups = [RolloutBatch.from_batch(decode(encode(item), to="torch"))
              for item, _ in sink.items]
    assert [g.prompts for g in groups] == [(p.question,) for p in problems[:3]]
    assert groups[1].columns == (problems[1].dataset_columns,)
    merged = RolloutBatch.concat(groups, pad_token_id=tokenizer.pad_token_id)
    assert merged.prompts == tuple(p.question for p in problems[:3])
    assert merged.select(slice(2, 6)).columns == tuple(p.dataset_columns for p in problems[1:3])
    assert merged.without_problems().prompts == () and merged.without_problems().columns == ()


def test_chat_message_prompts_use_the_tokenizer_template_whatever_the_template(model) -> None:
    from rlinf.envs.math import MathProblem
    from rlinf.workers.models import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    problem = MathProblem("2+2", "4", messages=({"role": "user", "content": "2+2?"},))
    bare, _ = _worker(model, tokenizer, template="short")
    assert tokenizer.decode(bare.encode_prompt(problem)).endswith("2+2=")
    tokenizer.chat_template = CHAT_TEMPLATE
    chat, _ = _worker(model, tokenizer, template="short")
    assert tokenizer.decode(chat.encode_prompt(problem)) == "[user]2+2?\n[assistant]"
