"""Import optional engines on demand, turning a missing one into `MissingExtraError`."""

from __future__ import annotations

import importlib
from types import ModuleType

from rlinf.workers.errors import MissingExtraError


def require(module: str, *, feature: str, extra: str) -> ModuleType:
    """Import `module` or raise `MissingExtraError` naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".", maxsplit=1)[0]
        if exc.name is not None and exc.name.split(".", maxsplit=1)[0] != top:
            raise  # the engine is installed but one of its own imports failed: show that
        raise MissingExtraError(feature, extra, module) from exc
