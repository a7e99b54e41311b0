"""The one sanitiser: text from outside pid, made safe to put on a terminal.

Outside text is anything pid did not write itself: a model's messages and errors, an agent's tool calls and command
output, a task, a server's error body, a file, item or worker name read back from a store. A terminal acts on some
characters instead of showing them: it writes the clipboard (OSC 52), sets the window title, makes a hyperlink
(OSC 8), moves the cursor and erases lines (CSI, also as the one-character C1 CSI U+009B), and it may reorder what
follows a bidi override. Such text reaches a person only through this module:

    strip_escapes  escape sequences and control characters removed, newline and tab kept: command output as the
                   model sees it, a check's output as result.json keeps it. Not yet fit for a terminal.
    shown          strip_escapes, and the characters that change how text reads without being seen removed too:
                   Unicode format characters (bidi overrides and isolates, zero-width ones: a ZWJ emoji shows as
                   its parts), line and paragraph separators; a lone surrogate (an undecodable byte) becomes U+FFFD.
                   Kept: every printable character, newline, tab. What every human-readable output prints.
    one_line       shown, every run of whitespace (newlines and tabs too) one space: a field of a one-line listing.
    escaped        a name (a file's, an archive member's) shown unambiguously: what `shown` removes is written as
                   an escape instead (\\x1b, \\u202e), backslashes doubled, bounded.
    dumps          exact JSON (--json): the same value, with every character `shown` would remove \\u-escaped.

The one control sequence pid writes itself lives here too: CLEAR_LINE, a live status line's return-and-erase
(cli/status_line.py), written only by cli/output.echo and never built from outside text.

A complete escape sequence goes whole (its payload too: an OSC 8 link leaves its text, OSC 52 leaves nothing); an
unterminated string sequence loses only its introducer, so what follows it shows as plain text instead of
vanishing. HTML is another matter (cli/pages/job.py escapes for the browser).
"""
from __future__ import annotations

import json
import logging
import re
import unicodedata
from typing import Any

CLEAR_LINE = "\r\x1b[K"   # back to the line's start, erase it: pid's own, never part of a message

_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"                         # CSI: colours, cursor movement, erasing
    r"|(?:\x1b[]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)"   # OSC, DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?"                                       # any other escape (charsets, keypad modes, ...)
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")       # C0 but tab and newline, DEL, C1; \r too
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})            # what a terminal must not be sent as is
_SIMPLE = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def strip_escapes(text: str) -> str:
    """`text` without escape sequences and control characters (newline and tab kept)."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text))


def _hidden(ch: str) -> bool:
    """A character `shown` removes (strip_escapes has taken the escape sequences): newline and tab are kept."""
    return ch not in "\n\t" and unicodedata.category(ch) in _HIDDEN


def shown(text: str) -> str:
    """`text` as a terminal may show it (see the module's docstring)."""
    text = strip_escapes(text)
    if text.isascii():
        return text
    return "".join("\ufffd" if 0xd800 <= ord(ch) <= 0xdfff else "" if _hidden(ch) else ch for ch in text)


def one_line(text: str) -> str:
    """`shown` on one line: whitespace runs (newlines, tabs) become one space, none at the ends."""
    return " ".join(shown(text).split())


def escaped(name: str, limit: int = 300) -> str:
    """`name` safe and unambiguous on a terminal: control, format and undecodable characters as escapes
    (an undecodable byte, kept by surrogateescape, as \\xNN), backslashes doubled, at most `limit` characters
    (the last one '…' when cut)."""
    out: list[str] = []
    size = 0
    for ch in name[:limit + 1]:
        if ch in _SIMPLE:
            text = _SIMPLE[ch]
        elif not _hidden(ch):
            text = ch
        else:
            code = ord(ch)
            if 0xdc80 <= code <= 0xdcff:           # an undecodable byte kept by surrogateescape
                code -= 0xdc00
            text = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
        if size + len(text) > limit:
            while out and size > limit - 1:
                size -= len(out.pop())
            out.append("…")
            return "".join(out)
        out.append(text)
        size += len(text)
    return "".join(out)


def _json_escape(match: re.Match[str]) -> str:
    ch = match.group()
    if not _hidden(ch):
        return ch
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xd800 + (code >> 10):04x}\\u{0xdc00 + (code & 0x3ff):04x}"


_JSON_SUSPECT = re.compile(r"[^\n -~]")   # json.dumps escapes the other C0 characters itself


def dumps(value: Any, indent: int | None = None) -> str:
    """`value` as JSON that parses back to exactly `value` and is safe on a terminal: readable non-ASCII text stays,
    what `shown` would remove is \\u-escaped (json.dumps leaves DEL, C1, bidi and lone surrogates raw). A raw newline
    in the result is indentation: inside strings json.dumps writes \\n."""
    return _JSON_SUSPECT.sub(_json_escape, json.dumps(value, ensure_ascii=False, indent=indent))


class ShownLogRecords(logging.Filter):
    """A log handler's filter: a record's message and traceback pass through `shown` (a worker's log, on a terminal,
    carries tasks, servers' errors, names)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:   # arguments that do not fit the format: the handler reports it, with the raw format
            message = str(record.msg)
        record.msg, record.args = shown(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = shown(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = shown(record.stack_info)
        return True
