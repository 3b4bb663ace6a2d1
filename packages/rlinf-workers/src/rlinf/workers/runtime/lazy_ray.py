"""Ray, imported where it is first used: a run on one machine never touches it, and its
import is a cost every process that imports the runtime would pay (the driver, the fork
server every local rank comes from). A process that has not imported Ray is not connected
to it (`connected`), so asking never imports it."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

__all__ = ["connected", "imported", "ray", "ray_exceptions"]


class _OnUse:
    """Stands for a module; its first attribute read imports it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"<{self._name}, imported on use>"


ray: Any = _OnUse("ray")
"""`ray`, imported on first use."""
ray_exceptions: Any = _OnUse("ray.exceptions")
"""`ray.exceptions`, imported on first use."""


def imported(name: str = "ray") -> ModuleType | None:
    """The module `name` if this process imported it already, else None (never imports)."""
    return sys.modules.get(name)


def connected() -> bool:
    """Whether this process is connected to Ray (``ray.init``), without importing Ray."""
    module = imported()
    return module is not None and bool(module.is_initialized())
