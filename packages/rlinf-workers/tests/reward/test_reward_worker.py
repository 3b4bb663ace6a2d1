from __future__ import annotations

import pytest
import torch

from rlinf.workers.errors import ConfigError, RewardFunctionError
from rlinf.workers.reward import RewardConfig, RewardScorer, load_reward_terms
from rlinf.workers.rollout import RolloutBatch, RolloutSample


def _batch(tokenizer, responses: list[str], answers: list[str], group_size: int,
           prompts: tuple = (), columns: tuple = ()) -> RolloutBatch:
    eos = tokenizer.eos_token_id
    samples = [
        RolloutSample(prompt_token_ids=tuple(tokenizer.encode("1+1=")),
                      response_token_ids=(*tokenizer.encode(text), eos),
                      log_probs=(-1.0,) * (len(text) + 1), finish_reason="stop")
        for text in responses
    ]
    return RolloutBatch.from_samples(samples, answers=answers, group_size=group_size,
                                     pad_token_id=tokenizer.pad_token_id, prompts=prompts,
                                     columns=columns)


def test_rewards_accuracy_and_group_pass_rate(tokenizer):
    batch = _batch(tokenizer, ["2", "3", "19", "x"], ["2", "2", "20", "20"], group_size=2)
    scored, stats = RewardScorer(tokenizer).compute_rewards(batch)
    assert scored.rewards is not None
    assert scored.rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert stats.accuracy == pytest.approx(0.25)
    assert stats.pass_at_group == pytest.approx(0.5)
    assert stats.responses == 4
    assert batch.rewards is None  # the input batch is not mutated


def test_decode_drops_padding_and_special_tokens(tokenizer):
    batch = _batch(tokenizer, ["12", "7"], ["12", "7"], group_size=1)
    assert RewardScorer(tokenizer).decode(batch) == ["12", "7"]


def test_format_penalty_applies_when_no_answer_is_found(tokenizer):
    worker = RewardScorer(tokenizer, config=RewardConfig(format_penalty=0.5))
    rewards = worker.score_texts(["no number here", "the answer is 4"], ["4", "4"])
    assert torch.equal(rewards, torch.tensor([-0.5, 1.0]))
    with pytest.raises(ConfigError):
        worker.score_texts(["1"], ["1", "2"])


@pytest.fixture
def user_rewards(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    return "user_rewards"


def test_the_verifier_starts_with_the_worker_only_when_asked_for_by_name(
        tokenizer, user_rewards, monkeypatch):
    import rlinf.workers.reward.worker as worker_module

    warmed: list[str] = []
    monkeypatch.setattr(worker_module, "warm_up_verifier", warmed.append)
    RewardScorer(tokenizer, config=RewardConfig(verifier="math_verify"))
    assert warmed == ["math_verify"]
    RewardScorer(tokenizer, config=RewardConfig(verifier="auto"))  # at its first need
    assert warmed == ["math_verify"]
    RewardScorer(tokenizer, config=RewardConfig(functions=(f"{user_rewards}:exact_match",)))
    assert warmed == ["math_verify"]  # a user's function: math-verify is not ours to start


def test_a_user_reward_function_scores_by_name(tokenizer, user_rewards):
    batch = _batch(tokenizer, ["2", "3", "19", "x"], ["2", "2", "19", "20"], group_size=2)
    worker = RewardScorer(tokenizer,
                          config=RewardConfig(functions=(f"{user_rewards}:exact_match",)))
    scored, stats = worker.compute_rewards(batch)
    assert scored.rewards.tolist() == [1.0, -0.5, 1.0, -0.5]
    assert stats.accuracy == pytest.approx(0.5)
    nested = RewardScorer(tokenizer,
                          config=RewardConfig(functions=(f"{user_rewards}:Scorers.length",)))
    assert nested.compute_rewards(batch)[0].rewards.tolist() == [1.0, 1.0, 2.0, 1.0]


def test_a_failing_reward_function_is_reported_with_its_sample(tokenizer, user_rewards):
    from rlinf.workers.errors import RewardFunctionError

    batch = _batch(tokenizer, ["2", "seven"], ["2", "7"], group_size=2)
    worker = RewardScorer(tokenizer, config=RewardConfig(functions=(f"{user_rewards}:broken",)))
    with pytest.raises(RewardFunctionError, match=r"user_rewards:broken.*ValueError.*"
                                                  r"sample 1: response 'seven', answer '7'"):
        worker.compute_rewards(batch)
    odd = RewardScorer(tokenizer, config=RewardConfig(functions=(f"{user_rewards}:not_a_number",)))
    with pytest.raises(RewardFunctionError, match="returned 'high', not a finite number"):
        odd.compute_rewards(batch)


@pytest.mark.parametrize(("spec", "message"), [
    ("user_rewards", "must read 'module:function'"),
    ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
    ("user_rewards:missing", "has no 'missing'"),
    ("user_rewards:THRESHOLD", "is a float, not a function"),
])
def test_bad_reward_function_names_say_what_is_wrong(tokenizer, user_rewards, spec, message):
    with pytest.raises(ConfigError, match=message):
        RewardScorer(tokenizer, config=RewardConfig(functions=(spec,)))


def test_the_verifier_decides_what_is_equal_beyond_numbers(tokenizer):
    pytest.importorskip("math_verify", reason="rlinf-envs[math]")
    responses, answers = ["\\boxed{\\frac{x}{2}}"], ["x/2"]
    boxed = ("boxed",)
    symbolic = RewardScorer(tokenizer, config=RewardConfig(strategies=boxed,
                                                           verifier="math_verify"))
    literal = RewardScorer(tokenizer, config=RewardConfig(strategies=boxed, verifier="builtin"))
    assert symbolic.score_texts(responses, answers).tolist() == [1.0]
    assert literal.score_texts(responses, answers).tolist() == [0.0]
    # the strategies' order: the boxed answer, not the last number
    both = RewardScorer(tokenizer, config=RewardConfig(strategies=("boxed", "last_number")))
    assert both.score_texts(["\\boxed{7} since 3+4 and 8"], ["7"]).tolist() == [1.0]


def test_verifier_limits_are_checked():
    with pytest.raises(ConfigError, match="verify_timeout"):
        RewardConfig(verify_timeout=0.0)
    with pytest.raises(ConfigError, match="verify_rel_tol"):
        RewardConfig(verify_rel_tol=-1.0)


def test_the_numeric_tolerance_is_an_option(tokenizer):
    pytest.importorskip("math_verify", reason="rlinf-envs[math]")
    responses, answers = ["\\boxed{0.8660254}"], ["\\frac{\\sqrt3}{2}"]
    exact = RewardScorer(tokenizer, config=RewardConfig(strategies=("boxed",)))
    loose = RewardScorer(tokenizer, config=RewardConfig(strategies=("boxed",),
                                                        verify_rel_tol=1e-6))
    assert exact.score_texts(responses, answers).tolist() == [0.0]
    assert loose.score_texts(responses, answers).tolist() == [1.0]


def test_a_verification_past_its_limit_scores_zero_and_is_counted(tokenizer):
    import threading

    pytest.importorskip("math_verify", reason="rlinf-envs[math]")
    # `(9^{9})^{9^{9}}` keeps math-verify busy for minutes, holding the GIL.
    batch = _batch(tokenizer, ["\\boxed{(9^{9})^{9^{9}}}", "\\boxed{\\sqrt{4}}"], ["3", "2"],
                   group_size=2)
    worker = RewardScorer(tokenizer, config=RewardConfig(strategies=("boxed",),
                                                         verify_timeout=1.0))
    results = []
    thread = threading.Thread(target=lambda: results.append(worker.compute_rewards(batch)),
                              daemon=True)
    thread.start()
    thread.join(timeout=120)  # generous: a fresh helper's start on a busy host, then 1 s
    assert not thread.is_alive()
    (scored, stats), = results
    assert scored.rewards.tolist() == [0.0, 1.0]
    assert stats.verify_timeouts == 1
    assert stats.accuracy == pytest.approx(0.5)
    _, plain = RewardScorer(tokenizer).compute_rewards(_batch(tokenizer, ["2"], ["2"],
                                                              group_size=1))
    assert plain.verify_timeouts == 0


def test_a_trl_batch_function_reads_dataset_columns(tokenizer, user_rewards):
    batch = _batch(tokenizer, ["2", "3", "19", "19"], ["2", "2", "19", "19"], group_size=2,
                   prompts=("1+1", "9+10"), columns=({"level": 1}, {"level": 3}))
    worker = RewardScorer(tokenizer, config=RewardConfig(
        functions=(f"{user_rewards}:level_bonus",)))
    assert worker.terms[0].shape == "batch"
    scored, stats = worker.compute_rewards(batch)
    assert scored.rewards.tolist() == [1.0, 0.0, 3.0, 3.0]
    assert stats.terms == {"level_bonus": pytest.approx(7 / 4)}


def test_chat_prompts_get_completions_as_assistant_messages(tokenizer, user_rewards):
    chat = [{"role": "user", "content": "1+1"}]
    worker = RewardScorer(tokenizer, config=RewardConfig(
        functions=(f"{user_rewards}:chat_length",)))
    as_chat = _batch(tokenizer, ["22", "3"], ["2", "2"], group_size=2, prompts=(chat,),
                     columns=({},))
    assert worker.compute_rewards(as_chat)[0].rewards.tolist() == [2.0, 1.0]
    as_text = _batch(tokenizer, ["22", "3"], ["2", "2"], group_size=2, prompts=("1+1",),
                     columns=({},))
    assert worker.compute_rewards(as_text)[0].rewards.tolist() == [0.0, 0.0]  # None is 0


def test_a_verl_compute_score_is_used_unchanged(tokenizer, user_rewards):
    columns = ({"data_source": "openai/gsm8k", "extra_info": {"index": 5}},)
    batch = _batch(tokenizer, ["72", "70"], ["72", "72"], group_size=2, prompts=("q",),
                   columns=columns)
    worker = RewardScorer(tokenizer, config=RewardConfig(
        functions=(f"{user_rewards}:compute_score",)))
    assert worker.terms[0].shape == "verl"
    assert worker.compute_rewards(batch)[0].rewards.tolist() == pytest.approx([1.05, 0.05])
    other = _batch(tokenizer, ["72"], ["72"], group_size=1, prompts=("q",),
                   columns=({"data_source": "lighteval/MATH", "extra_info": {"index": 0}},))
    with pytest.raises(RewardFunctionError, match=r"compute_score.*NotImplementedError.*"
                                                  r"sample 0: response '72'"):
        worker.compute_rewards(other)


def test_weighted_functions_sum_and_each_is_reported(tokenizer, user_rewards):
    batch = _batch(tokenizer, ["2", "3", "19", "x"], ["2", "2", "19", "20"], group_size=2,
                   prompts=("1+1", "9+10"), columns=({"level": 1}, {"level": 3}))
    worker = RewardScorer(tokenizer, config=RewardConfig(
        functions=("math", f"{user_rewards}:level_bonus"), weights=(1.0, 0.5)))
    scored, stats = worker.compute_rewards(batch)
    # math: 1 0 1 0; level_bonus: 1 0 3 0
    assert scored.rewards.tolist() == [1.5, 0.0, 2.5, 0.0]
    assert stats.terms == {"math": 0.5, "level_bonus": 1.0}
    assert stats.accuracy == 0.5  # correctness is the verifier's, not the weighted sum's
    assert stats.mean_reward == pytest.approx(1.0)


@pytest.mark.parametrize(("functions", "weights", "message"), [
    (("user_rewards:too_few",), (), "a batch function returns a list of 2 numbers"),
])
def test_a_batch_function_returning_the_wrong_count_is_named(tokenizer, user_rewards,
                                                             functions, weights, message):
    batch = _batch(tokenizer, ["2", "3"], ["2", "2"], group_size=2, prompts=("q",),
                   columns=({},))
    worker = RewardScorer(tokenizer, config=RewardConfig(functions=functions, weights=weights))
    with pytest.raises(RewardFunctionError, match=message):
        worker.compute_rewards(batch)


@pytest.mark.parametrize(("functions", "weights", "message"), [
    (("user_rewards:three_arguments",), (), "expected one of"),
    (("math", "user_rewards:exact_match"), (1.0,), "1 reward weights for 2 functions"),
    (("math", "math"), (), "name one twice"),
    (("math",), (float("nan"),), "finite"),
])
def test_bad_reward_setups_say_what_is_wrong(tokenizer, user_rewards, functions, weights,
                                             message):
    with pytest.raises(ConfigError, match=message):
        RewardScorer(tokenizer, config=RewardConfig(functions=functions, weights=weights))


def test_names_shared_by_two_functions_are_told_apart(user_rewards):
    terms = load_reward_terms((f"{user_rewards}:exact_match", "user_rewards:Scorers.length",
                               "math"), (), builtin=lambda r, a: 0.0)
    assert [t.name for t in terms] == ["exact_match", "length", "math"]
    assert [t.shape for t in terms] == ["sample", "sample", "sample"]


def test_a_reward_function_is_checked_before_launch_by_name_and_on_a_real_sample(user_rewards):
    from rlinf.workers.reward import RewardSample, check_reward_function

    check_reward_function(f"{user_rewards}:exact_match", RewardSample("7", "7", "3+4=", {}))
    check_reward_function(f"{user_rewards}:broken")  # imports, of a known shape
    with pytest.raises(RewardFunctionError, match=r"user_rewards:broken.*ValueError"):
        check_reward_function(f"{user_rewards}:broken", RewardSample("seven", "7", "3+4=", {}))
    with pytest.raises(ConfigError, match="has no 'missing'"):
        check_reward_function(f"{user_rewards}:missing")
