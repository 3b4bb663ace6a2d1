"""Lazy imports of optional dependencies, turning a missing module into MissingExtraError."""

from __future__ import annotations

import importlib
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
