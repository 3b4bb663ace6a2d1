from __future__ import annotations

import pytest

from rlinf.envs import ConfigError
from rlinf.envs.math import MathProblem, compact_form, format_chat, format_prompt

PROBLEM = MathProblem("What is 12 + 7?", "19", metadata={"compact": "12+7="})


def test_plain_asks_for_box() -> None:
    prompt = format_prompt(PROBLEM)
    assert prompt.startswith("What is 12 + 7?\n")
    assert "\\boxed{}" in prompt


def test_short_uses_compact_form() -> None:
    assert format_prompt(PROBLEM, template="short") == "12+7="
    assert compact_form(MathProblem("3*4", "12")) == "3*4="


def test_chat() -> None:
    messages = format_chat(PROBLEM)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert format_chat(PROBLEM, system_prompt=None) == [
        {"role": "user", "content": "What is 12 + 7?"}
    ]
    text = format_prompt(PROBLEM, template="chat", system_prompt="Be brief.")
    assert text == "System: Be brief.\nUser: What is 12 + 7?\nAssistant:"


def test_unknown_template() -> None:
    with pytest.raises(ConfigError, match="unknown prompt template"):
        format_prompt(PROBLEM, template="fancy")  # type: ignore[arg-type]


def test_a_question_that_ends_in_an_equals_sign_gets_no_second_one() -> None:
    assert compact_form(MathProblem("49-97=", "-48")) == "49-97="
    assert compact_form(MathProblem("  49-97 =  ", "-48")) == "49-97 ="
    assert format_prompt(MathProblem("49-97", "-48"), template="short") == "49-97="
