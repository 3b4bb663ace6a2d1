"""Tools a model calls while it answers: a sandboxed Python interpreter (`run_python`), a
calculator (`calculate`) and users' own functions (`load_tool`), held by name in a
`ToolRegistry` whose calls always return a `ToolResult` (its ``observation`` is the text the
model reads next); `parse_tool_calls` reads the calls a model wrote."""

from rlinf.envs.tools.calculator import calculate
from rlinf.envs.tools.registry import (
    Tool,
    ToolCall,
    ToolRegistry,
    default_tools,
    load_tool,
    parse_tool_calls,
)
from rlinf.envs.tools.sandbox import SandboxLimits, ToolResult, run_python

__all__ = ["SandboxLimits", "Tool", "ToolCall", "ToolRegistry", "ToolResult", "calculate",
           "default_tools", "load_tool", "parse_tool_calls", "run_python"]
