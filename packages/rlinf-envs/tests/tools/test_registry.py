"""Tools by name: schemas, argument checks, user tools, and parsed calls; every failure an
error observation."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlinf.envs.errors import ConfigError
from rlinf.envs.tools import ToolCall, ToolRegistry, default_tools, load_tool, parse_tool_calls

sys.path.insert(0, str(Path(__file__).parent))


def test_the_default_tools_answer_calls() -> None:
    tools = default_tools()
    assert tools.names == ["calculator", "python"]
    assert [s["function"]["name"] for s in tools.schemas()] == ["calculator", "python"]
    assert tools.call(ToolCall("calculator", {"expression": "6*7"})).output == "42"
    assert tools.call(ToolCall("python", {"code": "print(2**5)"})).output.strip() == "32"


@pytest.mark.parametrize(("call", "message"), [
    (ToolCall("search", {"q": "x"}), "unknown tool 'search'; the tools are"),
    (ToolCall("calculator", {}), "missing argument(s) ['expression']"),
    (ToolCall("calculator", {"expression": 42}), "'expression' of tool 'calculator' must be"),
    (ToolCall("calculator", {"expr": "1"}), "takes no argument 'expr'"),
])
def test_a_bad_call_is_an_error_observation(call: ToolCall, message: str) -> None:
    result = default_tools().call(call)
    assert not result.ok and message in (result.error or ""), result


def test_a_users_tool_registers_by_name_with_a_schema_from_its_annotations() -> None:
    tool = load_tool("my_tools:convert")
    assert tool.description == "Convert a length in metres to another unit."
    assert tool.parameters == {"type": "object", "properties": {
        "value": {"type": "number"}, "unit": {"type": "string"},
        "precise": {"type": "boolean"}}, "required": ["value", "unit"]}
    tools = ToolRegistry([tool])
    assert tools.call(ToolCall("convert", {"value": 2.5, "unit": "cm"})).output == "250"
    failed = tools.call(ToolCall("convert", {"value": 1, "unit": "mile"}))
    assert not failed.ok and failed.error == "KeyError: 'mile'"
    with pytest.raises(ConfigError, match="needs an annotation"):
        load_tool("my_tools:untyped")
    given = load_tool("my_tools:untyped", schema={"type": "object", "properties": {
        "value": {"type": "string"}}, "required": ["value"]})
    assert ToolRegistry([given]).call(ToolCall("untyped", {"value": "x"})).output == "x"
    with pytest.raises(ConfigError, match="registered already"):
        ToolRegistry([tool, tool])


def test_calls_are_parsed_from_the_hermes_format() -> None:
    text = ('Let me compute. <tool_call>{"name": "calculator", "arguments": '
            '{"expression": "12*7"}}</tool_call> and <tool_call>{oops}</tool_call>'
            '<tool_call>["calculator"]</tool_call>')
    calls, errors = parse_tool_calls(text)
    assert calls == [ToolCall("calculator", {"expression": "12*7"})]
    assert len(errors) == 2 and "not JSON" in errors[0] and "is {" in errors[1]
    assert parse_tool_calls("no call here") == ([], [])
