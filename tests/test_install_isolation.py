"""Each package installs alone, the way a user installs it, and pulls no heavy extra.

DESIGN.md §2: `pip install ./packages/rlinf-comm` must not pull torch or Ray, and importing a
package never fails because an extra is missing. Each case builds a fresh venv, so this is
the slowest test here; it runs in the `test-integration` tox env.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = {"torch", "ray", "cupy-cuda12x", "vllm", "transformers"}


def _pip_install(tmp_path: Path, package: str) -> tuple[Path, set[str]]:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           # A private cache: a wheel built earlier from the same local path must not stand
           # in for the tree under test.
           "PIP_CACHE_DIR": str(tmp_path / "pip-cache")}
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(ROOT / "packages" / package)],
                   check=True, env=env, timeout=900)
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], check=True,
                            capture_output=True, text=True, env=env).stdout
    return python, {entry["name"].lower() for entry in json.loads(listed)}


@pytest.mark.parametrize(
    ("package", "module", "expect_installed"),
    [
        ("rlinf-comm", "rlinf.comm", {"rlinf-comm", "numpy", "pyarrow", "structlog"}),
        ("rlinf-sched", "rlinf.sched", {"rlinf-sched", "rlinf-comm"}),
        ("rlinf-envs", "rlinf.envs", {"rlinf-envs", "gymnasium", "mujoco"}),
    ],
)
def test_package_installs_alone_without_heavy_extras(
    tmp_path: Path, package: str, module: str, expect_installed: set[str]
) -> None:
    python, installed = _pip_install(tmp_path, package)
    assert expect_installed <= installed, f"missing: {expect_installed - installed}"
    assert not (HEAVY & installed), f"{package} pulled heavy extras: {HEAVY & installed}"
    # Importing works and loads none of the optional heavy modules.
    probe = (
        f"import sys, {module}; "
        "heavy = sorted(m for m in ('torch', 'ray', 'cupy', 'vllm') if m in sys.modules); "
        "print(','.join(heavy))"
    )
    out = subprocess.run([str(python), "-c", probe], check=True, capture_output=True,
                         text=True, cwd=tmp_path).stdout.strip()
    assert out == "", f"import {module} loaded {out}"


def test_missing_extra_names_the_extra(tmp_path: Path) -> None:
    """Asking for torch tensors without torch raises MissingExtraError naming the extra."""
    python, installed = _pip_install(tmp_path, "rlinf-comm")
    assert "torch" not in installed
    probe = (
        "import numpy as np\n"
        "from rlinf.comm import Batch, MissingExtraError\n"
        "from rlinf.comm._internal import codec\n"
        "buf = codec.encode(Batch({'x': np.arange(4)}))\n"
        "try:\n"
        "    codec.decode(buf, to='torch')\n"
        "except MissingExtraError as exc:\n"
        "    print('extra=' + exc.extra)\n"
    )
    result = subprocess.run([str(python), "-c", probe], check=False, capture_output=True,
                            text=True,
                            cwd=tmp_path)
    assert result.stdout.strip() == "extra=torch", result.stdout + result.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
