"""The status line on a real pseudo-terminal: pid's own erase-line is the only control sequence it writes besides
its styles, hostile text streamed in pieces never passes an escape sequence, and it is gone at the end. The excerpt
of a tool's output that --verbose shows is bounded and sanitised."""
from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import sys
import termios

import pytest

from pid.cli.status_line import StatusLine, _width, on_terminal, status_text
from pid.event_records import EXCERPT_HEAD, EXCERPT_TAIL, EXCERPT_WIDTH, output_excerpt

ALLOWED = {"\x1b[K", "\x1b[2m", "\x1b[0m"}   # CLEAR_LINE's erase, and click's dim style on and off


@pytest.fixture
def pty_stderr(monkeypatch):
    """A function putting sys.stderr on a pseudo-terminal (in the test itself: pytest's capture sets sys.stderr
    again after the fixtures), which returns a function reading what reached it."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # 24 rows, 100 columns
    stream = open(slave, "w", encoding="utf-8", closefd=True)
    monkeypatch.setenv("TERM", "xterm")

    def read() -> str:
        stream.flush()
        out = b""
        while select.select([master], [], [], 0.2)[0]:
            out += os.read(master, 65536)
        return out.decode()

    def install():
        monkeypatch.setattr(sys, "stderr", stream)
        return read
    yield install
    stream.close()
    os.close(master)


def test_the_status_line_writes_only_its_own_control_sequences(pty_stderr):
    read = pty_stderr()
    assert on_terminal(err=True)
    line = StatusLine(err=True, describe=lambda: status_text("turn 1: waiting for the model", 1234, 0.5, 3.2))
    line.draw()
    line.echo("✓ bash ls \x1b]52;c;ZXZpbA==\x07 after \u202e")
    for piece in ("Hel", "lo \x1b", "[2J wor", "\x9b31mld\n", "tail"):   # escapes split across a reply's pieces
        line.stream(piece)
    line.end_stream()
    line.stop()
    out = read()
    assert set(re.findall(r"\x1b\[[0-9;]*[A-Za-z]", out)) <= ALLOWED, repr(out)
    assert out.count("\x1b") == len(re.findall(r"\x1b\[[0-9;]*[A-Za-z]", out)), repr(out)   # no other escape
    assert "\x9b" not in out and "\u202e" not in out and "\x07" not in out
    assert "turn 1: waiting for the model · 1,234 tokens · $0.50 · 3s" in out
    assert "✓ bash ls  after" in out and "Hello [2J world\r\ntail\r\n" in out, repr(out)
    assert out.endswith("\r\x1b[K"), repr(out)   # the status line erased at the end, nothing after it


def test_off_a_terminal_there_is_no_status_line(monkeypatch, tmp_path):
    with open(tmp_path / "out", "w") as f:
        monkeypatch.setattr(sys, "stdout", f)
        assert not on_terminal(err=False)


def test_a_tool_output_excerpt_is_bounded_and_shown():
    text = "".join(f"line {n} \x1b[31mred\x1b[0m\n" for n in range(1000)) + "x" * 10_000
    lines = output_excerpt(text)
    assert len(lines) == EXCERPT_HEAD + 1 + EXCERPT_TAIL
    assert lines[0] == "line 0 red" and lines[EXCERPT_HEAD] == "… 993 more lines" and lines[-2] == "line 999 red"
    assert lines[-1] == "x" * (EXCERPT_WIDTH - 1) + "…"
    assert output_excerpt("a\tb\n") == ["a   b"] and output_excerpt("") == []


def test_a_terminal_that_reports_no_width_gets_the_whole_status_line(monkeypatch):
    """`script -c CMD /dev/null` (and some serial consoles) give a pseudo-terminal of 0 columns: the status line is
    then cut to $COLUMNS, else 80, never to a stub of 20 characters."""
    master, slave = os.openpty()   # a fresh pty reports 0 rows and 0 columns
    stream = open(slave, "w", encoding="utf-8", closefd=True)
    try:
        monkeypatch.setattr(sys, "stderr", stream)
        monkeypatch.delenv("COLUMNS", raising=False)
        assert _width(err=True) == 80
        monkeypatch.setenv("COLUMNS", "120")
        assert _width(err=True) == 120
    finally:
        stream.close()
        os.close(master)
