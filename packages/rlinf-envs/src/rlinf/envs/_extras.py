"""Lazy imports of optional dependencies, turning a missing module into MissingExtraError."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from rlinf.envs.errors import MissingExtraError


def import_extra(module: str, *, extra: str, feature: str) -> ModuleType:
    """Import `module`, or raise MissingExtraError naming the `extra` that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        # Only a missing top-level module means "extra not installed"; an ImportError from
        # inside an installed package is a real bug and must surface unchanged.
        missing = getattr(exc, "name", None)
        if missing is not None and missing.partition(".")[0] == module.partition(".")[0]:
            raise MissingExtraError(feature, extra, module) from exc
        raise


def has_module(module: str) -> bool:
    """Whether `module` can be imported (imports it as a side effect when it can)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def is_installed(module: str) -> bool:
    """Whether the top-level package of `module` is installed, without importing it (for a
    process that only hands the work to another, e.g. the verifier's helper)."""
    return importlib.util.find_spec(module.partition(".")[0]) is not None


def require_installed(module: str, *, extra: str, feature: str) -> None:
    """`is_installed`, or MissingExtraError naming the `extra` that provides `module`."""
    if not is_installed(module):
        raise MissingExtraError(feature, extra, module)
