"""Output limits shared by read (keeps the head) and bash (keeps the tail).

Both cut on whole lines so the model never sees half a line, except when a single line is itself over the byte cap.
Byte counts are UTF-8 bytes of the text joined with "\\n" (separators count, no trailing newline).
Lines are counted as pi 0.8x counts them (split_lines): a final newline ends the last line and starts none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MAX_LINES = 2000
MAX_BYTES = 50 * 1024

TruncatedBy = Literal["lines", "bytes"] | None


def format_size(n: int) -> str:
    """`512B`, `50.0KB`, `2.3MB` (1024-based)."""
    if n < 1024:
        return f"{n}B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f}KB"
    return f"{n / (1024 * 1024):.1f}MB"


def split_lines(text: str) -> list[str]:
    """The text's lines: split on "\\n", a final newline ending the last line (not starting an empty one), and no
    lines at all in empty text. "a\\nb\\n" and "a\\nb" are both two lines."""
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return lines


def utf8_len(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


@dataclass
class HeadTruncation:
    content: str
    output_lines: int               # how many of the given lines are in `content`
    truncated_by: TruncatedBy       # None when every given line fits
    first_line_exceeds: bool = False  # the first line alone is over the byte cap; `content` is empty


def truncate_head(lines: list[str], max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES) -> HeadTruncation:
    """Keep leading whole lines within both caps."""
    if lines and utf8_len(lines[0]) > max_bytes:
        return HeadTruncation("", 0, "bytes", first_line_exceeds=True)
    kept: list[str] = []
    size = 0
    for i, line in enumerate(lines):
        if i >= max_lines:
            return HeadTruncation("\n".join(kept), len(kept), "lines")
        cost = utf8_len(line) + (1 if i else 0)
        if size + cost > max_bytes:
            return HeadTruncation("\n".join(kept), len(kept), "bytes")
        kept.append(line)
        size += cost
    return HeadTruncation("\n".join(kept), len(kept), None)


@dataclass
class TailTruncation:
    content: str
    output_lines: int
    output_bytes: int
    truncated_by: TruncatedBy
    last_line_partial: bool = False  # the last line alone is over the cap; `content` is its end


def truncate_tail(lines: list[str], max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES) -> TailTruncation:
    """Keep trailing whole lines within both caps; a last line over the byte cap keeps its final bytes."""
    kept: list[str] = []
    size = 0
    truncated_by: TruncatedBy = None
    for i in range(len(lines) - 1, -1, -1):
        if len(kept) >= max_lines:
            truncated_by = "lines"
            break
        line = lines[i]
        cost = utf8_len(line) + (1 if kept else 0)
        if size + cost > max_bytes:
            truncated_by = "bytes"
            if not kept:
                tail = tail_utf8(line, max_bytes)
                return TailTruncation(tail, 1, utf8_len(tail), "bytes", last_line_partial=True)
            break
        kept.append(line)
        size += cost
    kept.reverse()
    return TailTruncation("\n".join(kept), len(kept), size, truncated_by)


def tail_utf8(text: str, max_bytes: int) -> str:
    """The longest suffix of `text` whose UTF-8 encoding fits in `max_bytes` (never splits a character)."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return text
    cut = len(data) - max_bytes
    while cut < len(data) and (data[cut] & 0xC0) == 0x80:  # skip continuation bytes
        cut += 1
    return data[cut:].decode("utf-8", "surrogatepass")

