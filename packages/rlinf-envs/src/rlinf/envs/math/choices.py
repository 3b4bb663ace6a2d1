"""Multiple-choice answers: an option's label (`(A)`, `A)`, `\\text{(A)}`, a bare `A`) and
the content that may follow it (`\\text{(A)}\\ \\sqrt{2}`).

Labels are the capital letters A to J. A bare letter is a label only when it is the whole
answer (`A`); followed by content it needs its parentheses or a text macro, so that an
expression such as `A x` or `B = 2` is never taken for an option.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["resolve_choice", "split_label"]

_LABEL_RE = re.compile(
    r"^(?:\\(?:text|textbf|mathrm|mathbf|textrm)\s*\{\s*\(?\s*([A-J])\s*\)?\s*\}"
    r"|\(\s*([A-J])\s*\)|([A-J])\))")
_BARE_RE = re.compile(r"^([A-J])\.?$")
_LEAD_RE = re.compile(r"^(?:\s|\\[ ,;:!]|\\quad|\\qquad|~|:|\.)+")


def split_label(text: str) -> tuple[str | None, str]:
    """``(label, content)`` of an answer: `\\text{(A)}\\ \\sqrt2` -> ``("A", "\\sqrt2")``,
    `(B)` -> ``("B", "")``, `\\sqrt2` -> ``(None, "\\sqrt2")``."""
    answer = text.strip().strip("$").strip()
    if match := _BARE_RE.match(answer):
        return match.group(1), ""
    match = _LABEL_RE.match(answer)
    if match is None:
        return None, answer
    label = next(group for group in match.groups() if group)
    return label, _LEAD_RE.sub("", answer[match.end():]).strip()


def resolve_choice(predicted: str, reference: str,
                   choices: Mapping[str, str] | None = None) -> bool | tuple[str, str]:
    """Labels decide when both answers carry one (`(A)` = `A` = `\\text{(A)} \\sqrt2`);
    otherwise the ``(predicted, reference)`` contents still to compare, a label replaced
    by its content when known (from the answer itself or from `choices`, label ->
    content). Answers without labels come back unchanged."""
    options = {key.strip().strip("()"): value for key, value in (choices or {}).items()}
    predicted_label, predicted_content = split_label(predicted)
    reference_label, reference_content = split_label(reference)
    if predicted_label is not None and reference_label is not None:
        return predicted_label == reference_label
    if predicted_label is not None:
        content = predicted_content or options.get(predicted_label, "")
        return (content, reference) if content else (predicted, reference)
    if reference_label is not None:
        content = reference_content or options.get(reference_label, "")
        return (predicted, content) if content else (predicted, reference)
    return predicted, reference
