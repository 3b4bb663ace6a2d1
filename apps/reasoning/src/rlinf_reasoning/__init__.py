"""RLinf reasoning app: GRPO on math, with a tiny warm-start checkpoint that runs on CPU."""

from rlinf_reasoning.version import __version__
from rlinf_reasoning.warmstart import WARMSTART_DIR, WarmstartError, load_warmstart

__all__ = ["WARMSTART_DIR", "WarmstartError", "__version__", "load_warmstart"]
