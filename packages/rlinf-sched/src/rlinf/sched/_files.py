"""Reading JSON or YAML files that hold one mapping, with errors that name the file."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["load_mapping"]


def load_mapping(
    path: str | os.PathLike[str], *, error: type[Exception], what: str
) -> Mapping[str, Any]:
    """Read a JSON or YAML file holding a mapping, raising `error` with a clear message."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise error(f"cannot read {what} file {str(p)!r}: {exc}") from exc
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:
            raise error(f"reading {str(p)!r} needs PyYAML: `pip install 'rlinf-sched[yaml]'`, "
                        "or write the file as JSON") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise error(f"{what} file {str(p)!r} is not valid YAML: {exc}") from exc
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise error(f"{what} file {str(p)!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise error(f"{what} file {str(p)!r} holds {type(data).__name__}: expected a mapping")
    return data
