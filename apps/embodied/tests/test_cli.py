"""``rlinf-embodied`` command-line mistakes: refused before Ray, in one line with exit 2."""

from __future__ import annotations

import pickle
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from rlinf_embodied.cli import load_config
from rlinf_embodied.config import resolve_placement
from rlinf_embodied.errors import UnknownKeyError, UnquotedValueError

_PROBE = """
import sys
from rlinf_embodied.cli import main
status = main(sys.argv[1:])
print("imported:", "ray" in sys.modules, "torch" in sys.modules)
sys.exit(status)
"""

SPEC = "env: 0, rollout: 1, actor: 0-1"
HINT = f"\"placement.spec='{SPEC}'\""


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _PROBE, *args, "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120, check=False)


def assert_refused(proc: subprocess.CompletedProcess[str], tmp_path: Path, *phrases: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    for phrase in phrases:
        assert phrase in proc.stderr, proc.stderr
    assert "imported: False False" in proc.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("args", "phrases"), [
    (("run.iteratons=3",), ("unknown config key 'run.iteratons'",
                            "did you mean 'run.iterations'?")),
    (("placment=hybrid",), ("unknown config key 'placment'", "did you mean 'placement'?")),
    (("nosuch=1",), ("unknown config key 'nosuch'",)),
])
def test_misspelled_key_suggests_the_known_one(tmp_path: Path, args: tuple[str, ...],
                                               phrases: tuple[str, ...]) -> None:
    proc = run_cli(tmp_path, *args)
    assert_refused(proc, tmp_path, *phrases)
    assert "+" + args[0] not in proc.stderr  # Hydra's hint would add a key nothing reads


@pytest.mark.parametrize("args", [
    ("placement=hybrid", *f"placement.spec={SPEC}".split(), "placement.num_devices=2"),  # shell
    ("placement=hybrid", f"placement.spec={SPEC}", "placement.num_devices=2"),  # Hydra
])
def test_unquoted_placement_says_how_to_quote_it(tmp_path: Path, args: tuple[str, ...]) -> None:
    assert_refused(run_cli(tmp_path, *args), tmp_path, "'placement.spec'", HINT)


def test_the_quoting_hint_is_what_hydra_accepts() -> None:
    cfg = load_config(["placement=hybrid", *shlex.split(HINT)])
    assert resolve_placement(cfg.placement).to_spec() == SPEC


def test_a_word_that_is_no_override_is_still_named(tmp_path: Path) -> None:
    assert_refused(run_cli(tmp_path, "iterations"), tmp_path, "'iterations' is not an override")


@pytest.mark.parametrize("err", [UnknownKeyError("run.iteratons", ("run.iterations",)),
                                 UnquotedValueError("placement.spec", SPEC)])
def test_errors_survive_pickling(err: Exception) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), str(back), back.args) == (type(err), str(err), err.args)
