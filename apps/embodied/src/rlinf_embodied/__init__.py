"""rlinf-embodied: PPO/GRPO for robot policies, pipelined across env and policy workers."""

from rlinf_embodied.version import __version__

__all__ = ["__version__"]
