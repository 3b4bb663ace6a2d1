"""Tools by name, with the JSON schemas a chat template shows the model, and the calls a
model writes parsed from its text.

`ToolRegistry` holds `Tool`s: the built-in ``python`` (the sandbox) and ``calculator``, and
users' own functions registered as ``module:function`` with a JSON schema (or one read from
the function's annotations). `ToolRegistry.call` checks the arguments against the schema and
turns every failure — an unknown tool, a bad argument, an exception — into an error
`ToolResult`, so a rollout always has an observation to append. `parse_tool_calls` reads the
Hermes/Qwen format, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlinf.envs.errors import ConfigError
from rlinf.envs.tools.calculator import calculate
from rlinf.envs.tools.sandbox import SandboxLimits, ToolResult, run_python

__all__ = ["Tool", "ToolCall", "ToolRegistry", "default_tools", "load_tool", "parse_tool_calls"]

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list, tuple), "object": (dict,),
}
_ANNOTATIONS = {str: "string", int: "integer", float: "number", bool: "boolean",
                list: "array", dict: "object"}


@dataclass(frozen=True)
class Tool:
    """One callable tool."""

    name: str
    """What the model writes in its call."""
    description: str
    """What the model reads about it."""
    parameters: Mapping[str, Any]
    """JSON schema of the arguments (an object with ``properties`` and ``required``)."""
    function: Callable[..., ToolResult | object]
    """Called with the arguments as keywords; a non-`ToolResult` result is shown as text."""

    def schema(self) -> dict[str, Any]:
        """The tool as chat templates take it (``tools=[...]``)."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": dict(self.parameters)}}

    def check(self, arguments: Mapping[str, Any]) -> str | None:
        """What is wrong with `arguments` against the schema, or None."""
        properties: Mapping[str, Any] = self.parameters.get("properties", {})
        unknown = [k for k in arguments if k not in properties]
        if unknown:
            return (f"tool {self.name!r} takes no argument {unknown[0]!r}; it takes "
                    f"{sorted(properties)}")
        missing = [k for k in self.parameters.get("required", ()) if k not in arguments]
        if missing:
            return f"missing argument(s) {missing} of tool {self.name!r}"
        for key, value in arguments.items():
            kind = properties[key].get("type")
            if kind in _TYPES and (not isinstance(value, _TYPES[kind]) or (
                    kind in ("integer", "number") and isinstance(value, bool))):
                return f"argument {key!r} of tool {self.name!r} must be a {kind}"
        return None


@dataclass(frozen=True)
class ToolCall:
    """A call a model wrote."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


class ToolRegistry:
    """Tools by name (module docstring)."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        """Register `tool`; ConfigError if its name is taken."""
        if tool.name in self._tools:
            raise ConfigError(f"a tool named {tool.name!r} is registered already")
        self._tools[tool.name] = tool

    @property
    def names(self) -> list[str]:
        """The registered tools' names."""
        return sorted(self._tools)

    def get(self, name: str) -> Tool:
        """The tool called `name`; ConfigError naming the tools there are if none is."""
        if name not in self._tools:
            raise ConfigError(f"no tool named {name!r}; the tools are {self.names}")
        return self._tools[name]

    def schemas(self) -> list[dict[str, Any]]:
        """Every tool's schema, for the chat template."""
        return [self._tools[name].schema() for name in self.names]

    def call(self, call: ToolCall) -> ToolResult:
        """Run `call`; every failure is an error result, never an exception."""
        started = time.perf_counter()
        tool = self._tools.get(call.name)
        if tool is None:
            return ToolResult(False, "", f"unknown tool {call.name!r}; the tools are "
                              f"{self.names}", 0.0)
        problem = tool.check(call.arguments)
        if problem is not None:
            return ToolResult(False, "", problem, 0.0)
        try:
            value = tool.function(**call.arguments)
        except Exception as exc:  # a user's tool: its failure is the model's observation
            return ToolResult(False, "", f"{type(exc).__name__}: {exc}",
                              time.perf_counter() - started)
        if isinstance(value, ToolResult):
            return value
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return ToolResult(True, text, None, time.perf_counter() - started)


def default_tools(limits: SandboxLimits | None = None) -> ToolRegistry:
    """``python`` (the sandbox with `limits`, None: the defaults) and ``calculator``."""
    limits = limits or SandboxLimits()
    return ToolRegistry([
        Tool("python", "Run Python code in a sandbox and return what it prints.",
             {"type": "object", "properties": {"code": {"type": "string"}},
              "required": ["code"]},
             lambda code: run_python(code, limits=limits)),
        Tool("calculator", "Evaluate an arithmetic expression exactly, e.g. '(12+7)*3/4'.",
             {"type": "object", "properties": {"expression": {"type": "string"}},
              "required": ["expression"]},
             calculate),
    ])


def load_tool(spec: str, *, schema: Mapping[str, Any] | None = None,
              description: str | None = None) -> Tool:
    """The function ``module:function`` names as a `Tool`, with `schema` (None: from its
    parameters' annotations: str, int, float, bool, list, dict) and `description` (None:
    its docstring's first line)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"tool {spec!r} must read 'module:function'")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"tool {spec!r}: {exc}") from exc
    if not callable(function):
        raise ConfigError(f"tool {spec!r} is a {type(function).__name__}, not a function")
    doc = (inspect.getdoc(function) or "").strip().splitlines()
    return Tool(attr, description or (doc[0] if doc else attr),
                schema if schema is not None else _schema_of(function, spec), function)


def _schema_of(function: Callable[..., Any], spec: str) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required = []
    for name, parameter in inspect.signature(function, eval_str=True).parameters.items():
        kind = _ANNOTATIONS.get(parameter.annotation)
        if kind is None:
            raise ConfigError(f"tool {spec!r}: parameter {name!r} needs an annotation of "
                              f"{sorted(t.__name__ for t in _ANNOTATIONS)}, or pass a schema")
        properties[name] = {"type": kind}
        if parameter.default is parameter.empty:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """The calls in `text` (Hermes/Qwen ``<tool_call>`` JSON blocks), and a message for each
    block that is not a call (the model then reads the message as its observation)."""
    calls, errors = [], []
    for block in _CALL.findall(text):
        try:
            data = json.loads(block)
        except json.JSONDecodeError as exc:
            errors.append(f"tool call is not JSON ({exc.msg}): {block[:80]!r}")
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or \
                not isinstance(data.get("arguments", {}), dict):
            errors.append(f"a tool call is {{\"name\": ..., \"arguments\": {{...}}}}, got "
                          f"{block[:80]!r}")
            continue
        calls.append(ToolCall(data["name"], data.get("arguments", {})))
    return calls, errors
