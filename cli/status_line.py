"""A live status line at the bottom of a terminal, for `pid run` and `pid logs -f`: what the job is doing, its tokens
and cost so far, how long it has run, redrawn in place.

Only on a terminal (`on_terminal`): a pipe or a file gets the plain lines and nothing else. While the line shows, every
other line goes through StatusLine.echo, which erases it first and draws it again below, so the line never mixes into
what stays on the screen; `stop` erases it for good. The assistant's reply streams in through `stream`: the cursor is
then in the middle of a line, so the status line waits until the reply ends (`end_stream`). Everything is written by
cli/output.echo, which sanitises the text; the only control sequence is echo's own CLEAR_LINE.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Callable

from pid.cli.output import Part, echo, styled
from pid.costs import format_cost

TICK_S = 0.5        # the elapsed time and a spinner move on at least this often
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def on_terminal(err: bool) -> bool:
    """Whether stderr (err) or stdout is a terminal that understands a redrawn line."""
    stream = sys.stderr if err else sys.stdout
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):   # no stream, or a closed one
        return False


def status_text(activity: str, tokens: int, cost: float, elapsed_s: float | None, paused: bool = False) -> str:
    """`turn 2: waiting for the model · 1,234 tokens · $0.0012 · 12s`."""
    took = "" if elapsed_s is None else f" · {_elapsed(elapsed_s)}"
    return f"{activity}{' (paused)' if paused else ''} · {tokens:,} tokens · {format_cost(cost)}{took}"


def _elapsed(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


class StatusLine:
    """The bottom line of a terminal, `describe()` redrawn on each `draw` (and every TICK_S once `start`ed). All of
    its writing holds one re-entrant lock: lines printed by the agent's threads, the ticker and a Ctrl-C handler never
    interleave inside a line."""

    def __init__(self, err: bool, describe: Callable[[], str]) -> None:
        self.err, self.describe = err, describe
        self._lock = threading.RLock()
        self._shown = False        # the status line is on the screen now
        self._streaming = False    # a reply is being written: the cursor may be mid-line
        self._mid_line = False
        self._stopped = False
        self._frame = 0
        self._done = threading.Event()

    def start(self) -> None:
        """Draw now, and again every TICK_S until `stop` (so that the elapsed time moves during a long wait)."""
        self.draw()
        threading.Thread(target=self._tick, name="pid-status-line", daemon=True).start()

    def _tick(self) -> None:
        while not self._done.wait(TICK_S):
            self.draw()

    def draw(self) -> None:
        with self._lock:
            if self._stopped or self._streaming:
                return
            try:
                text = self.describe()
            except Exception:   # the status must never break the job it shows
                return
            self._frame = (self._frame + 1) % len(SPINNER)
            text = f"{SPINNER[self._frame]} {text}"
            width = _width(self.err) - 1   # never the last column: the cursor would wait to wrap there
            if len(text) > width:
                text = text[:width - 1] + "…"
            echo(styled(text, dim=True), err=self.err, nl=False, clear=True)
            self._shown = True

    def echo(self, *parts: Part, err: bool | None = None) -> None:
        """cli/output.echo's line, above the status line."""
        with self._lock:
            self._leave_line()
            echo(*parts, err=self.err if err is None else err)
            self.draw()

    def stream(self, text: str) -> None:
        """A piece of the assistant's reply, written as it comes (sanitised by echo, newlines kept)."""
        if not text:
            return
        with self._lock:
            if self._stopped:
                return
            if not self._streaming:
                self._erase()
                self._streaming = True
            echo(text, err=self.err, nl=False)
            self._mid_line = not text.endswith("\n")

    def end_stream(self) -> None:
        """The reply ended (or something else happens): finish its line and show the status line again."""
        with self._lock:
            if self._streaming:
                self._leave_line()
                self.draw()

    def stop(self) -> None:
        """Erase the status line for good (a reply being written gets its line ended)."""
        self._done.set()
        with self._lock:
            self._leave_line()
            self._stopped = True

    def _leave_line(self) -> None:
        """The cursor at the start of an empty line: the status line erased, a streamed reply's line ended."""
        if self._streaming:
            if self._mid_line:
                echo("", err=self.err)
            self._streaming = self._mid_line = False
        self._erase()

    def _erase(self) -> None:
        if self._shown:
            echo(err=self.err, nl=False, clear=True)
            self._shown = False


def _width(err: bool) -> int:
    """The terminal's width (a line longer than it would wrap, and CLEAR_LINE would erase only its last row). A
    terminal that reports none (0 columns: `script -c CMD /dev/null`, a serial console) counts as $COLUMNS, else 80."""
    try:
        columns = os.get_terminal_size((sys.stderr if err else sys.stdout).fileno()).columns
    except (OSError, ValueError, AttributeError):
        columns = 0
    if columns <= 0:
        given = os.environ.get("COLUMNS", "")
        columns = int(given) if given.isdigit() and int(given) > 0 else 80
    return max(20, columns)
