"""The env tests' fixtures and helpers serve these tests too (one definition)."""

from ..env.conftest import CONTEXT, make_env, make_policy

__all__ = ["CONTEXT", "make_env", "make_policy"]
