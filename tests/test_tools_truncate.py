"""Truncation arithmetic shared by read (head) and bash (tail)."""
from pid.tools.truncate import (MAX_BYTES, format_size, split_lines, tail_utf8, truncate_head, truncate_tail)


def test_format_size():
    assert format_size(0) == "0B"
    assert format_size(1023) == "1023B"
    assert format_size(1024) == "1.0KB"
    assert format_size(51200) == "50.0KB"
    assert format_size(60000) == "58.6KB"
    assert format_size(1024 * 1024) == "1.0MB"
    assert format_size(9_000_000) == "8.6MB"


def test_head_line_cap():
    cut = truncate_head([str(i) for i in range(2001)])
    assert (cut.output_lines, cut.truncated_by) == (2000, "lines")
    assert truncate_head([str(i) for i in range(2000)]).truncated_by is None


def test_head_byte_cap_counts_separators_exactly():
    # 100 lines of 511 chars + 99 separators = 51199 bytes: fits; one more byte per line does not.
    assert truncate_head(["x" * 511] * 100).truncated_by is None
    fits = truncate_head(["x" * 512] * 100)
    assert (fits.output_lines, fits.truncated_by) == (99, "bytes")
    assert len(fits.content.encode()) <= MAX_BYTES


def test_head_counts_utf8_bytes_not_characters():
    cut = truncate_head(["é" * 300] * 100)  # 600 bytes + 1 separator per line
    assert cut.output_lines == 85 and cut.truncated_by == "bytes"


def test_head_first_line_over_cap():
    cut = truncate_head(["x" * (MAX_BYTES + 1), "short"])
    assert cut.first_line_exceeds and cut.content == ""


def test_tail_keeps_last_lines():
    cut = truncate_tail([str(i) for i in range(1, 3001)])
    assert cut.output_lines == 2000 and cut.truncated_by == "lines"
    assert cut.content.startswith("1001\n") and cut.content.endswith("\n3000")


def test_tail_partial_last_line_cuts_on_utf8_boundary():
    cut = truncate_tail(["short", "€" * 30000])
    assert cut.last_line_partial and cut.output_lines == 1
    assert cut.content == "€" * 17066 and cut.output_bytes == 51198


def test_tail_utf8():
    assert tail_utf8("abc", 10) == "abc"
    assert tail_utf8("a€b", 4) == "€b"
    assert tail_utf8("a€b", 3) == "b"


def test_split_lines_counts_as_pi_does():
    """pi 0.8x: a final newline ends the last line and starts no empty one; empty text has no lines."""
    assert split_lines("") == []
    assert split_lines("\n") == [""]
    assert split_lines("a\nb\n") == split_lines("a\nb") == ["a", "b"]
    assert split_lines("a\n\n") == ["a", ""]
    assert len(split_lines("".join(f"{i}\n" for i in range(100)))) == 100
