"""Choosing a headless OpenGL backend for MuJoCo offscreen rendering.

MuJoCo picks its GL backend from `MUJOCO_GL` when `mujoco` is first imported, so the choice
has to be made before that. Measured on the project's CPU machines (Debian bookworm, Mesa
22.3): `egl` renders through Mesa's llvmpipe without a display; `osmesa` fails (no
libOSMesa installed); the default `glfw` needs an X display.
"""

from __future__ import annotations

import os
import sys

import structlog

_log = structlog.get_logger(__name__)
_warned: set[str] = set()  # warnings already logged in this process


def configure_headless_gl() -> str | None:
    """Set MUJOCO_GL=egl when no display and no explicit choice; return the GL backend.

    Returns None (and changes nothing) when `mujoco` was already imported without a
    `MUJOCO_GL` choice: it is too late to pick one, and rendering may then fail with a
    RenderError that says so.
    """
    chosen = os.environ.get("MUJOCO_GL")
    if chosen:
        return chosen
    if os.environ.get("DISPLAY"):
        return "glfw"
    if "mujoco" in sys.modules:
        if "late_import" not in _warned:
            _warned.add("late_import")
            _log.warning("mujoco_gl_unset_after_import",
                         hint="set MUJOCO_GL=egl before importing mujoco to render headless")
        return None
    # Process-wide on purpose: MuJoCo reads it once, at import, from the environment.
    os.environ["MUJOCO_GL"] = "egl"
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    return "egl"
