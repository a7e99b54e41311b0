"""The building blocks of `pid view`'s pages (cli/pages/job.py, cli/pages/batch.py): escaping, clipping, diffs,
number formats, and the page shell with its CSS and its Content-Security-Policy.

Whatever a page shows was written by an agent, hence hostile: every string goes through `esc` before it reaches the
page, no data ever goes into a script, and the policy allows no network at all and only the page's own inline script
(by its hash), so that a mistake in escaping still runs nothing. Every block is clipped (head and tail, with a note)
so that a page stays readable whatever it is given.
"""
from __future__ import annotations

import base64
import hashlib
import html
import math
import os
import re
from dataclasses import dataclass
from typing import Any

from pid.cli.output import format_duration
from pid.costs import format_cost
from pid.terminal import strip_escapes


@dataclass
class Limits:
    """How much of each thing a page shows (characters)."""
    block: int = 20_000            # one text, output or argument block
    diff_lines: int = 1_500        # one edit's or write's diff
    patch: int = 1_000_000         # the final patch
    check_tail: int = 20_000       # the check's output tail
    full_budget: int = 4_000_000   # transcript HTML rendered in full
    compact_budget: int = 6_000_000  # then one line per tool call, up to this
    result_bytes: int = 16 << 20   # a larger result.json is not read


LIMITS = Limits()

def as_dict(value: Any) -> dict[str, Any]:
    """A JSON object, or an empty one for anything else: every field of the input may be missing or malformed."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# Bidi controls reorder what follows them where they are not seen ("Trojan Source": a patch that reads otherwise than
# it runs): a page shows each as a visible mark, e.g. ⟨U+202E⟩, where it stands (the terminal drops them instead).
BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def esc(value: Any) -> str:
    """Text for an HTML element or a quoted attribute: escape sequences and control characters removed (by the one
    sanitiser, pid/terminal.py), bidi controls made visible (BIDI), then HTML-escaped."""
    text = strip_escapes(value if isinstance(value, str) else str(value))
    if not text.isascii():
        text = BIDI.sub(lambda m: f"\u27e8U+{ord(m.group()):04X}\u27e9", text)
    return html.escape(text, quote=True)


def clip(text: str, limit: int) -> tuple[str, int]:
    """At most about `limit` characters: the head and the tail, a line saying how many were left out between them
    in their place; and that number."""
    if len(text) <= limit:
        return text, 0
    head = limit * 2 // 3
    tail = limit - head
    left = len(text) - limit
    return f"{text[:head]}\n[… {left:,} characters not shown here …]\n{text[len(text) - tail:]}", left


def omitted_note(n: int, what: str = "characters") -> str:
    return f'<div class="omitted">… {n:,} {what} not shown here …</div>' if n else ""


def pre(text: str, limit: int, cls: str = "") -> str:
    return f'<pre class="{cls}">{esc(clip(text, limit)[0])}</pre>'


# -- diffs ---------------------------------------------------------------------------------------------------------

_HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_META = ("diff ", "index ", "new file", "deleted file", "similarity", "rename ", "old mode", "new mode", "Binary files",
         "--- ", "+++ ")


def diff_classes(lines: list[str]) -> list[str]:
    """Each line's part in a unified diff: meta (headers), hunk, add, del, ctx. Inside a hunk its counts decide, so
    that a removed "-- comment" line is no "--- file" header; outside one (pi's numbered diffs) the first character."""
    classes: list[str] = []
    old = new = 0
    for line in lines:
        hunk = _HUNK.match(line)
        if hunk:
            old, new = int(hunk.group(1) or 1), int(hunk.group(2) or 1)
            classes.append("hunk")
        elif line.startswith("\\"):
            classes.append("meta")
        elif old > 0 or new > 0:
            kind = {"+": "add", "-": "del"}.get(line[:1], "ctx")
            old -= kind != "add"
            new -= kind != "del"
            classes.append(kind)
        elif line.startswith(_META):
            classes.append("meta")
        else:
            classes.append({"+": "add", "-": "del"}.get(line[:1], "hunk" if line.startswith("@@") else "ctx"))
    return classes


def diff_html(text: str, max_lines: int) -> str:
    """A unified diff (or pi's numbered `+12 text` diff) with its added, removed, hunk and header lines marked; the
    middle of a diff longer than max_lines is left out, with a note in its place."""
    lines = text.splitlines()
    classes = diff_classes(lines)
    rows = list(zip(classes, lines))
    if len(rows) > max_lines:
        head = max_lines * 2 // 3
        left = len(rows) - max_lines
        rows = rows[:head] + [("omitted", f"… {left:,} lines not shown here …")] + rows[len(rows) - (max_lines - head):]
    return '<div class="diff">' + "".join(f'<div class="{cls}">{esc(line) or " "}</div>' for cls, line in rows) + \
        "</div>"


# -- the page ------------------------------------------------------------------------------------------------------

CSS = """
:root{--bg:#fff;--fg:#1f2328;--dim:#656d76;--line:#d0d7de;--box:#f6f8fa;--user:#ddf4ff;--add:#dafbe1;--del:#ffebe9;
--hunk:#ddf4ff;--ok:#1a7f37;--bad:#cf222e;--warn:#9a6700;--link:#0969da}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--dim:#8d96a0;--line:#30363d;--box:#161b22;
--user:#0c2d6b;--add:#12361f;--del:#4a1a1f;--hunk:#0c2d6b;--ok:#3fb950;--bad:#f85149;--warn:#d29922;--link:#4493f8}}
*{box-sizing:border-box}
body{margin:0 auto;max-width:1100px;padding:1rem 1.25rem 4rem;background:var(--bg);color:var(--fg);
font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif}
a{color:var(--link)}
h1{font-size:1.3rem;margin:.2rem 0 .6rem}h2{font-size:1.1rem;margin:2rem 0 .6rem;border-bottom:1px solid var(--line)}
pre,code,.diff{font:12.5px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{white-space:pre-wrap;word-break:break-word;margin:.3rem 0;padding:.5rem .7rem;background:var(--box);
border:1px solid var(--line);border-radius:6px;max-height:40rem;overflow:auto}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:.15rem 1rem;margin:0}
dl.meta dt{color:var(--dim)}dl.meta dd{margin:0;word-break:break-word}
.badge{display:inline-block;padding:0 .45rem;border-radius:1rem;font-size:.85em;font-weight:600;border:1px solid}
.ok{color:var(--ok)}.bad{color:var(--bad)}.warn{color:var(--warn)}.dim,.omitted{color:var(--dim)}
.omitted{font-style:italic;font-size:.9em}
.msg{margin:.8rem 0;padding:.5rem .8rem;border:1px solid var(--line);border-radius:8px}
.msg.user{background:var(--user)}.msg .who{font-size:.8rem;font-weight:600;color:var(--dim);text-transform:uppercase}
.msg .text{white-space:pre-wrap;word-break:break-word;margin:.2rem 0}
.md{word-break:break-word;margin:.2rem 0}.md p,.md ul,.md ol{margin:.35rem 0}
.md h3,.md h4,.md h5,.md h6{margin:.6rem 0 .3rem}
.md code{background:var(--box);padding:0 .2rem;border-radius:3px}.md pre code{background:none;padding:0}
.tool .when{font-weight:400;color:var(--dim);font-size:.85em;margin-left:.4rem}
.badge.not-applied{text-transform:uppercase;letter-spacing:.03em}
.not-applied-change{opacity:.6;border-left:3px solid var(--bad);padding-left:.4rem;text-decoration:line-through}
.live{border-left-color:var(--ok)}
.note{margin:.6rem 0;padding:.3rem .8rem;border-left:3px solid var(--line);color:var(--dim);font-size:.9em}
.tool{margin:.5rem 0;padding:.4rem .6rem;border:1px solid var(--line);border-radius:6px;background:var(--bg)}
.tool.error{border-color:var(--bad)}.tool-head{font-weight:600}.tool-head code{font-weight:400}
.tool.compact{padding:.1rem .6rem}
details>summary{cursor:pointer;color:var(--dim);font-size:.9em}
.diff{background:var(--box);border:1px solid var(--line);border-radius:6px;overflow:auto;max-height:40rem;
margin:.3rem 0;padding:.3rem 0}
.diff div{white-space:pre;padding:0 .7rem;min-height:1.45em}
.diff .add{background:var(--add)}.diff .del{background:var(--del)}.diff .hunk{background:var(--hunk);color:var(--dim)}
.diff .meta{font-weight:600}
nav{font-size:.9em}nav a{margin-right:1rem}
table{border-collapse:collapse;width:100%;font-size:.92em}
th,td{padding:.3rem .5rem;border-bottom:1px solid var(--line);text-align:left;white-space:nowrap}
td.num,th.num{text-align:right}th{cursor:pointer;user-select:none}
td.task{max-width:26rem;overflow:hidden;text-overflow:ellipsis;color:var(--dim)}
th[aria-sort=ascending]::after{content:" ▲"}th[aria-sort=descending]::after{content:" ▼"}
tbody tr:hover{background:var(--box)}
"""


def csp(script: str = "") -> str:
    """No network, no plugins, no frames; inline styles; only `script` (by its hash) may run."""
    allowed = "'none'"
    if script:
        allowed = "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"
    return (f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src {allowed}; "
            f"base-uri 'none'; form-action 'none'")


def page(title: str, body: str, script: str = "", refresh_s: int | None = None) -> str:
    """`refresh_s`: the browser reloads the page that often (a meta refresh: no script, allowed by the policy)."""
    tail = f"<script>{script}</script>" if script else ""
    refresh = f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh_s else ""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<meta http-equiv="Content-Security-Policy" content="{csp(script)}">{refresh}'
            f'<meta name="referrer" content="no-referrer">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body>\n{body}\n{tail}</body></html>\n")


def number(value: Any) -> float | None:
    """A finite number, or None (JSON may say NaN, Infinity or 1e999, which no format can print as an int)."""
    if isinstance(value, bool):
        return None
    try:
        n = float(value) if isinstance(value, (int, float, str)) else None
    except (ValueError, OverflowError):
        return None
    return n if n is not None and math.isfinite(n) else None


def fmt_duration(value: Any) -> str:
    s = number(value)
    return "—" if s is None else format_duration(s)


def fmt_cost(value: Any) -> str:
    c = number(value)
    return "—" if c is None else format_cost(c)


def fmt_int(value: Any) -> str:
    n = number(value)
    return "—" if n is None else f"{int(n):,}"


def status_class(status: Any) -> str:
    return {"completed": "ok", "limit": "warn", "cancelled": "warn", "queued": "dim", "running": "dim",
            "unknown": "dim"}.get(str(status), "bad")


def badge(text: Any, cls: str) -> str:
    return f'<span class="badge {cls}">{esc(text)}</span>'


def check_badge(check: Any) -> str:
    """A result's or a batch item's check: passed, failed (timed out), or a dash when there is none."""
    if isinstance(check, dict):
        passed = check.get("passed")
        if passed is None and number(check.get("exit_code")) is not None:
            passed = number(check.get("exit_code")) == 0
    elif isinstance(check, bool):
        passed = check
    else:
        return '<span class="dim">—</span>'
    timed_out = isinstance(check, dict) and check.get("timed_out")
    text = "passed" if passed else ("timed out" if timed_out else "failed")
    return badge(text, "ok" if passed else "bad")


def write_page(path: str, text: str) -> None:
    """Written whole (a temporary file renamed over the target); lone surrogates from JSON become U+FFFD."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", errors="replace") as f:
        f.write(text)
    os.replace(tmp, path)
