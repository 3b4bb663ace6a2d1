"""How a model writes a tool call and reads the tool's answer, in tokens.

Two formats:

- `TagFormat`, for models that know no chat template (the tiny char model): the model writes
  ``<calculator>12+7</calculator>``, the tool's answer comes back as
  ``<result>19</result>`` and the model goes on (``19``). A tool takes one string argument
  here, its schema's first required one.
- `HermesFormat`, what Qwen and Hermes chat models are trained on:
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, answered by tool messages
  rendered through the tokenizer's own chat template (``<tool_response>`` blocks in Qwen's).

Each gives the token sequences that end a turn (`stop_sequences`: the closing tags),
reads the calls of a turn that ended on one (`parse`), and renders the observations to
append (`observation_ids`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from transformers import PreTrainedTokenizerBase

from rlinf.envs.tools import ToolCall, ToolRegistry, parse_tool_calls
from rlinf.workers.errors import ConfigError

__all__ = ["HermesFormat", "ParsedTurn", "TagFormat", "ToolFormat", "ToolFormatName",
           "make_tool_format"]

ToolFormatName = Literal["tags", "hermes"]
"""`TagFormat` or `HermesFormat`."""


@dataclass(frozen=True)
class ParsedTurn:
    """The calls a turn made, and a message for each attempt that was not a valid call."""

    calls: tuple[ToolCall, ...]
    errors: tuple[str, ...]


class ToolFormat(Protocol):
    """A tool-call format (module docstring)."""

    stop_sequences: tuple[tuple[int, ...], ...]
    """Token ids of the closing tags that end a turn with a call."""

    def parse(self, turn_text: str) -> ParsedTurn:
        """The calls of a turn that ended on a closing tag."""
        ...

    def observation_ids(self, observations: Sequence[str]) -> list[int]:
        """Token ids that hand the model `observations` (one per call or error) and let it
        answer on."""
        ...


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class TagFormat:
    """``<name>argument</name>`` calls, ``<result>...</result>`` observations."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tools: ToolRegistry, *,
                 result_tag: str = "result") -> None:
        self.tokenizer = tokenizer
        self.result_tag = result_tag
        self._argument: dict[str, str] = {}
        for schema in tools.schemas():
            function = schema["function"]
            parameters: dict[str, Any] = function.get("parameters", {})
            names = list(parameters.get("required") or parameters.get("properties") or ())
            if not names:
                raise ConfigError(f"tool {function['name']!r} takes no argument; the tag "
                                  "format passes the text between the tags as one")
            self._argument[function["name"]] = names[0]
        self.stop_sequences: tuple[tuple[int, ...], ...] = tuple(
            tuple(_ids(tokenizer, f"</{name}>")) for name in self._argument)
        self._call = re.compile(
            r"<(" + "|".join(map(re.escape, self._argument)) + r")>(.*?)</\1>\s*\Z", re.DOTALL)

    def parse(self, turn_text: str) -> ParsedTurn:
        """The call that closes `turn_text`."""
        found = self._call.search(turn_text)
        if found is None:
            closing = turn_text[turn_text.rfind("</"):]
            return ParsedTurn((), (f"{closing} closes no call: write "
                                   f"<name>argument</name> with a name of "
                                   f"{sorted(self._argument)}",))
        name, argument = found.group(1), found.group(2)
        return ParsedTurn((ToolCall(name, {self._argument[name]: argument}),), ())

    def observation_ids(self, observations: Sequence[str]) -> list[int]:
        """``<result>...</result>`` per observation."""
        tag = self.result_tag
        return _ids(self.tokenizer, "".join(f"<{tag}>{text}</{tag}>" for text in observations))


_MARKS = ("RLINFASSISTANTMARK", "RLINFTOOLMARKONE", "RLINFTOOLMARKTWO")


class HermesFormat:
    """``<tool_call>`` JSON calls, tool messages through the chat template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tools: ToolRegistry) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"the hermes tool format renders tool answers with the tokenizer's chat "
                f"template, and this {type(tokenizer).__name__} has none: use the tags format")
        self.tokenizer = tokenizer
        self.tools = tools
        self.stop_sequences: tuple[tuple[int, ...], ...] = (
            tuple(_ids(tokenizer, "</tool_call>")),)
        self._before, self._between, self._after = self._framing()

    def _framing(self) -> tuple[str, str, str]:
        """The template's text between an assistant turn and its tool answers, between two
        answers, and after them up to the next assistant turn, found by rendering a probe
        conversation."""
        assistant, first, second = _MARKS
        messages = [{"role": "user", "content": "question"},
                    {"role": "assistant", "content": assistant},
                    {"role": "tool", "content": first}, {"role": "tool", "content": second}]
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                  tokenize=False)
        assert isinstance(text, str)
        try:
            end = text.index(assistant) + len(assistant)
            one, two = text.index(first, end), text.index(second, end)
        except ValueError as exc:
            raise ConfigError("this chat template does not render tool messages; use the "
                              "tags format or a chat model whose template knows the tool "
                              "role") from exc
        return text[end:one], text[one + len(first):two], text[two + len(second):]

    def parse(self, turn_text: str) -> ParsedTurn:
        """Every ``<tool_call>`` block of the turn."""
        calls, errors = parse_tool_calls(turn_text)
        if not calls and not errors:
            errors = ["</tool_call> closes no <tool_call> block"]
        return ParsedTurn(tuple(calls), tuple(errors))

    def observation_ids(self, observations: Sequence[str]) -> list[int]:
        """The tool messages as the chat template frames them, then the assistant's turn."""
        body = self._between.join(observations)
        return _ids(self.tokenizer, self._before + body + self._after)


def make_tool_format(name: ToolFormatName, tokenizer: PreTrainedTokenizerBase,
                     tools: ToolRegistry) -> ToolFormat:
    """The format called `name` for `tokenizer` and `tools`."""
    if name == "tags":
        return TagFormat(tokenizer, tools)
    if name == "hermes":
        return HermesFormat(tokenizer, tools)
    raise ConfigError(f"tool format must be 'tags' or 'hermes', got {name!r}")
