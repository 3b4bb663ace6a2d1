"""``rlinf-reasoning`` flags, help and config errors (no training, no Ray)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from rlinf_reasoning._schema import describe
from rlinf_reasoning.cli import help_text, main, parse_args
from rlinf_reasoning.config import ReasoningConfig

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
    (("nosuch.key=1",), "Could not override 'nosuch.key'"),
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
