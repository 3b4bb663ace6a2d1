"""bench-agent's code tool: the calculator's call answered by a Python program in the
sandbox (``print(12+7)``, a process per call), under the name the tool-calling warm start
writes (``<calculator>``)."""

from __future__ import annotations

from rlinf.envs.tools import ToolResult, run_python


def calculator(expression: str) -> ToolResult:
    """Evaluate an arithmetic expression with Python, in the sandbox."""
    result = run_python(f"print({expression})")
    return ToolResult(result.ok, result.output.strip(), result.error, result.seconds)
