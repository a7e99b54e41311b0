"""A tool call's line cuts a long reason visibly ("…"), so a reader never takes a cut one for the whole (issue 22)."""
from __future__ import annotations

from cli.output import tool_line


def text_of(parts: list) -> str:
    return "".join(p if isinstance(p, str) else p.text for p in parts)


def test_a_long_reason_is_cut_with_an_ellipsis() -> None:
    reason = ("Could not find the exact text in calc.py. The old text must match exactly including all whitespace "
              "and newlines.")
    line = text_of(tool_line("edit", "calc.py", True, reason, 0.01))
    assert line.rstrip().endswith("…")


def test_a_short_reason_is_whole() -> None:
    line = text_of(tool_line("edit", "calc.py", True, "file not found", 0.01))
    assert line.rstrip().endswith("— file not found")
