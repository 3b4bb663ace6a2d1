"""Package names whose submodules are imported on first use.

`rlinf.workers.models` and `rlinf.workers.rollout` gather names from submodules that need
transformers' model classes. Every Ray actor process of a flow imports `rlinf.workers.flow`,
which reaches both packages; an embodied run's env, policy and trainer processes never use
them, and importing them eagerly cost each of those processes seconds of CPU at every
launch, which on a small machine slows every flow's start. `rlinf.workers.reasoning`
imports each role's module on first use, so a role's process loads its own module only.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["lazy_attribute"]


def lazy_attribute(package: str, homes: Mapping[str, str], name: str) -> Any:
    """For a package's module-level ``__getattr__``: `name` read from its submodule
    ``homes[name]`` (relative to `package`), imported now if it was not yet."""
    try:
        module = homes[name]
    except KeyError:
        raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(f"{package}.{module}"), name)
