from __future__ import annotations

import pytest

from rlinf.envs.math.choices import resolve_choice, split_label


@pytest.mark.parametrize(("text", "expected"), [
    ("A", ("A", "")),
    ("(A)", ("A", "")),
    ("$(B)$", ("B", "")),
    ("C)", ("C", "")),
    ("D.", ("D", "")),
    ("\\text{(A)}", ("A", "")),
    ("\\textbf{(E)}\\ 12", ("E", "12")),
    ("\\text{(A)}\\ \\sqrt{2}", ("A", "\\sqrt{2}")),
    ("\\text{(A)} \\sqrt2", ("A", "\\sqrt2")),
    ("(C): 5", ("C", "5")),
    ("\\sqrt{2}", (None, "\\sqrt{2}")),
    ("A x", (None, "A x")),  # a bare letter followed by more is an expression
    ("B = 2", (None, "B = 2")),
    ("(a)", (None, "(a)")),  # labels are capitals
    ("K", (None, "K")),  # A to J
    ("(1, 2)", (None, "(1, 2)")),
])
def test_split_label(text: str, expected: tuple[str | None, str]) -> None:
    assert split_label(text) == expected


@pytest.mark.parametrize(("predicted", "reference", "choices", "expected"), [
    ("(A)", "A", None, True),
    ("A", "(A)", None, True),
    ("\\text{(A)} \\sqrt2", "A", None, True),
    ("\\text{(B)} \\sqrt2", "A", None, False),  # the label decides
    ("(A) 5", "(A) 7", None, True),
    ("\\text{(A)}\\ \\sqrt{2}", "\\sqrt{2}", None, ("\\sqrt{2}", "\\sqrt{2}")),
    ("\\sqrt2", "(A) \\sqrt{2}", None, ("\\sqrt2", "\\sqrt{2}")),
    ("\\sqrt2", "A", {"A": "\\sqrt{2}", "B": "2"}, ("\\sqrt2", "\\sqrt{2}")),
    ("(B)", "2", {"(A)": "\\sqrt{2}", "(B)": "2"}, ("2", "2")),
    ("\\sqrt2", "A", None, ("\\sqrt2", "A")),  # no content known: compared as written
    ("x + 1", "x+1", None, ("x + 1", "x+1")),
])
def test_resolve_choice(predicted: str, reference: str, choices: dict[str, str] | None,
                        expected: bool | tuple[str, str]) -> None:
    assert resolve_choice(predicted, reference, choices) == expected
