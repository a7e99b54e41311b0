"""The tables of `pid list`, `pid workers` and `pid batch --status`: a header row, columns aligned whatever their
values' lengths, and the whole within the terminal's width (COLUMNS, else the terminal's; piped without COLUMNS:
no limit, as ls and git do).

When the table is too wide, the columns marked shrinkable give way, rightmost first, each down to its minimum. An id
column keeps the END of its ids (ids are typed by their end: cli/ids.py) and never shrinks so far that two of its ids
look alike. Cells are expected as single lines (pid.terminal.one_line)."""
from __future__ import annotations

import os
import shutil
import sys
import unicodedata
from dataclasses import dataclass

GAP = "  "
MORE = "…"


@dataclass
class Column:
    header: str
    right: bool = False     # numbers: aligned right
    shrink: str = ""        # "": never; "start": keeps its start (text); "end": keeps its end, values stay distinct
    min: int = 0            # narrowest when shrinking (at least the header's width)


def terminal_width() -> int | None:
    """The width to fit: $COLUMNS, else the terminal's on stdout; None (no limit) when piped."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    except (OSError, ValueError):
        return None


def cells(text: str) -> int:
    """Display width: East Asian wide characters take two cells, combining marks none."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def cut(text: str, width: int, keep: str) -> str:
    """`text` in at most `width` cells, "…" where it was cut: keeping its start or its end."""
    if cells(text) <= width:
        return text
    if width <= 0:
        return ""
    chars = list(text) if keep == "start" else list(reversed(text))
    kept, used = [], 1
    for c in chars:
        if used + cells(c) > width:
            break
        kept.append(c)
        used += cells(c)
    return "".join(kept) + MORE if keep == "start" else MORE + "".join(reversed(kept))


def _narrowest(values: list[str], floor: int, natural: int) -> int:
    """The narrowest width >= floor at which the values, keeping their ends, stay as distinct as they are."""
    distinct = len(set(values))
    for width in range(floor, natural):
        if len({cut(v, width, "end") for v in values}) == distinct:
            return width
    return natural


def render(columns: list[Column], rows: list[list[str]], width: int | None) -> list[str]:
    """The table's lines, header first; trailing blanks dropped."""
    natural = [max([cells(c.header), *(cells(row[i]) for row in rows)]) for i, c in enumerate(columns)]
    widths = list(natural)
    total = sum(widths) + len(GAP) * (len(columns) - 1)
    for i in reversed(range(len(columns))):
        if width is None or total <= width:
            break
        column = columns[i]
        if not column.shrink:
            continue
        floor = max(column.min, cells(column.header))
        if column.shrink == "end":
            floor = _narrowest([row[i] for row in rows], floor, natural[i])
        narrower = max(floor, widths[i] - (total - width))
        total -= widths[i] - min(narrower, widths[i])
        widths[i] = min(narrower, widths[i])
    lines = []
    for row in [[c.header for c in columns], *rows]:
        shown = []
        for value, column, w in zip(row, columns, widths):
            value = cut(value, w, "end" if column.shrink == "end" else "start")
            pad = " " * (w - cells(value))
            shown.append(pad + value if column.right else value + pad)
        lines.append(GAP.join(shown).rstrip())
    return lines
