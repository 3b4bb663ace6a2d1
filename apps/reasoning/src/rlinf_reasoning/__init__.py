"""RLinf reasoning app: GRPO on math, with a tiny warm-start checkpoint that runs on CPU.

Importing the package is cheap (no torch): the CLI validates a config and prints ``--help``
in well under a second. The warm-start names load torch and transformers on first use.
"""

from typing import TYPE_CHECKING, Any

from rlinf_reasoning.version import __version__

if TYPE_CHECKING:
    from rlinf_reasoning.warmstart import WARMSTART_DIR, WarmstartError, load_warmstart

_LAZY = {"WARMSTART_DIR", "WarmstartError", "load_warmstart"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from rlinf_reasoning import warmstart

        return getattr(warmstart, name)
    raise AttributeError(f"module 'rlinf_reasoning' has no attribute {name!r}")


__all__ = ["WARMSTART_DIR", "WarmstartError", "__version__", "load_warmstart"]
