"""The tool-call formats: what ends a turn, what a turn called, how answers are framed."""

from __future__ import annotations

import pytest

from rlinf.envs.tools import ToolCall, default_tools
from rlinf.workers.errors import ConfigError
from rlinf.workers.models import build_char_tokenizer
from rlinf.workers.rollout.tool_formats import HermesFormat, TagFormat, make_tool_format
from rlinf.workers.rollout.tool_loop import ToolLoopConfig

# A Qwen2.5-style template: tool answers become <tool_response> blocks in one user turn.
_QWEN_LIKE = (
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_the_tag_format_reads_the_call_that_ends_a_turn():
    tokenizer = build_char_tokenizer()
    fmt = TagFormat(tokenizer, default_tools())
    assert tuple(tokenizer.encode("</calculator>", add_special_tokens=False)) in \
        fmt.stop_sequences
    parsed = fmt.parse("<calculator>12+7</calculator>")
    assert parsed.calls == (ToolCall("calculator", {"expression": "12+7"}),)
    assert fmt.parse("<python>print(1)</python>").calls[0].arguments == {"code": "print(1)"}
    broken = fmt.parse("12+7</calculator>")
    assert not broken.calls and "closes no call" in broken.errors[0]
    assert tokenizer.decode(fmt.observation_ids(["19"])) == "<result>19</result>"


def test_the_hermes_format_frames_answers_with_the_chat_template():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = _QWEN_LIKE
    fmt = make_tool_format("hermes", tokenizer, default_tools())
    assert isinstance(fmt, HermesFormat)
    parsed = fmt.parse('<tool_call>{"name": "calculator", "arguments": '
                       '{"expression": "2*3"}}</tool_call>')
    assert parsed.calls == (ToolCall("calculator", {"expression": "2*3"}),)
    # The prompt, the model's turn and the framed answers read as the template renders the
    # whole conversation: the model continues exactly where a chat run would.
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
    question = [{"role": "user", "content": "2*3?"}]
    prompt = tokenizer.apply_chat_template(question, add_generation_prompt=True, tokenize=False)
    whole = tokenizer.apply_chat_template(
        [*question, {"role": "assistant", "content": call}, {"role": "tool", "content": "6"},
         {"role": "tool", "content": "[error] x"}], add_generation_prompt=True, tokenize=False)
    observed = tokenizer.decode(fmt.observation_ids(["6", "[error] x"]))
    assert prompt + call + observed == whole
    assert "<tool_response>\n6\n</tool_response>" in observed
    assert "closes no" in fmt.parse("</tool_call>").errors[0]


def test_formats_and_tools_are_checked(tmp_path, monkeypatch):
    (tmp_path / "user_tools_mod.py").write_text(
        "def word_count(text: str) -> int:\n    return len(text.split())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    tokenizer = build_char_tokenizer()
    with pytest.raises(ConfigError, match="chat template"):
        HermesFormat(tokenizer, default_tools())
    with pytest.raises(ConfigError, match="tags' or 'hermes"):
        make_tool_format("xml", tokenizer, default_tools())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown tool 'search'"):
        ToolLoopConfig(tools=("search",)).registry()
    with pytest.raises(ConfigError, match="twice"):
        ToolLoopConfig(tools=("python", "python"))
    registry = ToolLoopConfig(tools=("calculator", "user_tools_mod:word_count")).registry()
    assert registry.names == ["calculator", "word_count"]
