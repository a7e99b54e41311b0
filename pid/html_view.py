"""A job as one self-contained HTML page: its result (status, reason, model, usage, check) and its transcript.

The transcript is agent-written, hence hostile: every string goes through `esc` (or `attr`) before it reaches the
page, no transcript data ever goes into a script, and the page's Content-Security-Policy allows no network at all
and only the page's own inline script (by hash), so that a mistake in escaping still runs nothing.

The page stays bounded whatever the session's size: the session is read in two passes (an index of entry offsets,
then only the entries on the current branch, one at a time), every block is clipped (head and tail, with a note),
and once the page holds FULL_BUDGET characters of transcript the rest of the tool calls are listed one line each,
up to COMPACT_BUDGET; past that a note says how much is left out.
"""
from __future__ import annotations

import base64
import difflib
import hashlib
import html
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

RESULT = "result.json"
SESSION = "session.jsonl"
PATCH = "patch.diff"


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

_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|[\x00-\x08\x0b-\x1f\x7f]")


def as_dict(value: Any) -> dict[str, Any]:
    """A JSON object, or an empty one for anything else: every field of the input may be missing or malformed."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def esc(value: Any) -> str:
    """Text for an HTML element or a quoted attribute: escaped, terminal escapes and control characters removed."""
    text = value if isinstance(value, str) else str(value)
    return html.escape(_CONTROL.sub("", text), quote=True)


def clip(text: str, limit: int) -> tuple[str, int]:
    """At most `limit` characters: the head and the tail, and how many were left out between them."""
    if len(text) <= limit:
        return text, 0
    head = limit * 2 // 3
    tail = limit - head
    return text[:head] + "\n" + text[len(text) - tail:], len(text) - limit


def omitted_note(n: int, what: str = "characters") -> str:
    return f'<div class="omitted">… {n:,} {what} not shown here …</div>' if n else ""


def pre(text: str, limit: int, cls: str = "") -> str:
    shown, left = clip(text, limit)
    return f'<pre class="{cls}">{esc(shown)}</pre>{omitted_note(left)}'


# -- diffs ---------------------------------------------------------------------------------------------------------

def _line_class(line: str) -> str:
    if line.startswith(("+++", "---", "diff ", "index ", "new file", "deleted file", "similarity", "rename ",
                        "old mode", "new mode", "Binary files")):
        return "meta"
    if line.startswith("@@"):
        return "hunk"
    if line.startswith("+"):
        return "add"
    if line.startswith("-"):
        return "del"
    if line.startswith("\\"):
        return "meta"
    return "ctx"


def diff_html(text: str, max_lines: int) -> str:
    """A unified diff (or pi's numbered `+12 text` diff) with its added, removed, hunk and header lines marked."""
    lines = text.splitlines()
    left = 0
    if len(lines) > max_lines:
        head = max_lines * 2 // 3
        left = len(lines) - max_lines
        lines = lines[:head] + [f"… {left:,} lines not shown here …"] + lines[len(lines) - (max_lines - head):]
    out = []
    for line in lines:
        cls = "omitted" if left and line.startswith("… ") and line.endswith(" not shown here …") else _line_class(line)
        out.append(f'<div class="{cls}">{esc(line) or " "}</div>')
    return f'<div class="diff">{"".join(out)}</div>'


def edit_diff(arguments: dict[str, Any], details: Any) -> str:
    """An edit's change as a unified diff: the tool's own patch when it gave one, else from its arguments."""
    if isinstance(details, dict):
        for key in ("patch", "diff"):
            if isinstance(details.get(key), str) and details[key].strip():
                return str(details[key])
    path = str(arguments.get("path", "file"))
    edits = arguments.get("edits")
    if isinstance(edits, str):
        try:
            edits = json.loads(edits)
        except ValueError:
            edits = None
    pairs = [e for e in edits if isinstance(e, dict)] if isinstance(edits, list) else []
    if "oldText" in arguments or "newText" in arguments:
        pairs.append(arguments)
    out: list[str] = []
    for i, pair in enumerate(pairs):
        old, new = str(pair.get("oldText", "")), str(pair.get("newText", ""))
        label = path if len(pairs) == 1 else f"{path} (edit {i + 1})"
        out.extend(difflib.unified_diff(old.splitlines(), new.splitlines(), label, label, lineterm="", n=3))
    return "\n".join(out)


def write_diff(arguments: dict[str, Any]) -> str:
    content = str(arguments.get("content", ""))
    path = str(arguments.get("path", "file"))
    lines = content.splitlines()
    return "\n".join([f"+++ {path}", f"@@ -0,0 +1,{len(lines)} @@", *("+" + line for line in lines)])


# -- the session ---------------------------------------------------------------------------------------------------

@dataclass
class Transcript:
    """The current branch of a session file, read lazily: `entries()` yields one parsed entry at a time."""
    path: str
    header: dict[str, Any] = field(default_factory=dict)
    chain: list[int] = field(default_factory=list)   # offsets of the branch's entries, oldest first
    total: int = 0                                   # entries in the file (every branch)
    unreadable: int = 0                              # lines that are not JSON objects
    model: str | None = None                         # the first model_change's, else the first assistant's
    usage: dict[str, float] = field(default_factory=dict)   # summed over every assistant message (result's shape)
    turns: int = 0
    tool_calls: int = 0

    @classmethod
    def read(cls, path: str) -> "Transcript":
        t = cls(path)
        parents: dict[str, tuple[int, str | None]] = {}
        last: str | None = None
        offset = 0
        loose: list[int] = []   # entries without ids (not pi's shape, but shown in file order)
        with open(path, "rb") as f:
            for raw in f:
                here, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except ValueError:
                    t.unreadable += 1
                    continue
                if not isinstance(obj, dict):
                    t.unreadable += 1
                    continue
                if obj.get("type") == "session" and not t.header:
                    t.header = obj
                    continue
                t.total += 1
                t._count(obj)
                entry_id = obj.get("id")
                if not isinstance(entry_id, str):
                    loose.append(here)
                    continue
                parent = obj.get("parentId")
                parents[entry_id] = (here, parent if isinstance(parent, str) else None)
                last = entry_id
        chain: list[int] = []
        seen: set[str] = set()
        while last is not None and last in parents and last not in seen:
            seen.add(last)
            here, last = parents[last]
            chain.append(here)
        t.chain = sorted(chain + loose)
        return t

    def _count(self, entry: dict[str, Any]) -> None:
        """The header's numbers when there is no result.json (a job still running, or a bare session file)."""
        if entry.get("type") == "model_change" and self.model is None and entry.get("modelId"):
            self.model = str(entry["modelId"])
        message = entry.get("message")
        if entry.get("type") != "message" or not isinstance(message, dict) or message.get("role") != "assistant":
            return
        self.turns += 1
        if self.model is None and message.get("model"):
            self.model = str(message["model"])
        content = message.get("content")
        self.tool_calls += sum(1 for b in content if isinstance(b, dict) and b.get("type") == "toolCall") \
            if isinstance(content, list) else 0
        usage = as_dict(message.get("usage"))
        cost = as_dict(usage.get("cost"))
        for key, value in (("input", usage.get("input")), ("output", usage.get("output")),
                           ("cache_read", usage.get("cacheRead")), ("total_tokens", usage.get("totalTokens")),
                           ("cost", cost.get("total"))):
            n = number(value)
            if n is not None:
                self.usage[key] = self.usage.get(key, 0) + n

    def numbers(self) -> dict[str, Any]:
        """result.json's fields as far as the session tells them."""
        return {"model": self.model, "turns": self.turns, "tool_calls": self.tool_calls, "usage": dict(self.usage)}

    def entries(self) -> Iterator[dict[str, Any]]:
        with open(self.path, "rb") as f:
            for offset in self.chain:
                f.seek(offset)
                yield json.loads(f.readline())


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


def page(title: str, body: str, script: str = "") -> str:
    tail = f"<script>{script}</script>" if script else ""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<meta http-equiv="Content-Security-Policy" content="{csp(script)}">'
            f'<meta name="referrer" content="no-referrer">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body>\n{body}\n{tail}</body></html>\n")


def number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def fmt_duration(value: Any) -> str:
    s = number(value)
    if s is None:
        return "—"
    if s < 60:
        return f"{s:.1f}s"
    minutes, secs = divmod(int(s), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def fmt_cost(value: Any) -> str:
    c = number(value)
    return "—" if c is None else f"${c:.4f}"


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


def check_html(check: Any, limits: Limits) -> str:
    if not isinstance(check, dict):
        return ""
    facts = [f"exit {esc(check['exit_code'])}" if check.get("exit_code") is not None else "",
             fmt_duration(check.get("duration_s")) if check.get("duration_s") is not None else "",
             "timed out" if check.get("timed_out") else ""]
    head = (f'<div>{check_badge(check)} <code>{esc(check.get("command", ""))}</code> '
            f'<span class="dim">{esc(" · ".join(f for f in facts if f))}</span></div>')
    tail = check.get("output_tail")
    if isinstance(tail, str) and tail:
        opened = "" if check.get("passed") else " open"
        head += (f'<details class="check-output"{opened}><summary>check output (tail)</summary>'
                 f'{pre(tail, limits.check_tail)}</details>')
    return head


def header_html(result: dict[str, Any], limits: Limits) -> str:
    usage = as_dict(result.get("usage"))
    status = result.get("status", "unknown")
    rows: list[tuple[str, str]] = [
        ("status", badge(status, status_class(status)) + (f' <span class="dim">{esc(result["exit_reason"])}</span>'
                                                           if result.get("exit_reason") else "")),
        ("model", esc(result.get("model") or "—")),
        ("tokens", f'{fmt_int(usage.get("total_tokens"))} <span class="dim">(in {fmt_int(usage.get("input"))}, out '
                   f'{fmt_int(usage.get("output"))}, cache read {fmt_int(usage.get("cache_read"))})</span>'),
        ("cost", fmt_cost(usage.get("cost"))),
        ("duration", fmt_duration(result.get("duration_s"))),
        ("turns", f'{fmt_int(result.get("turns"))} <span class="dim">· {fmt_int(result.get("tool_calls"))} tool '
                  f'calls</span>'),
    ]
    if "check" in result:
        rows.append(("check", check_html(result.get("check"), limits) or '<span class="dim">—</span>'))
    for key in ("repo", "image", "started_at", "finished_at"):
        if result.get(key):
            rows.append((key.replace("_", " "), esc(result[key])))
    if result.get("error"):
        rows.append(("error", f'<span class="bad">{esc(clip(str(result["error"]), limits.block)[0])}</span>'))
    body = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    out = f'<dl class="meta">{body}</dl>'
    if result.get("task"):
        out += f'<h2>Task</h2><div class="msg user">{text_html(str(result["task"]), limits)}</div>'
    if result.get("final_message"):
        out += f'<h2>Final message</h2><div class="msg">{text_html(str(result["final_message"]), limits)}</div>'
    return out


def text_html(text: str, limits: Limits) -> str:
    shown, left = clip(text, limits.block)
    return f'<div class="text">{esc(shown)}</div>{omitted_note(left)}'


def content_text(content: Any) -> str:
    """A message's text (its text blocks joined; images named)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") == "image":
            parts.append(f"[image {block.get('mimeType', '')}, {len(str(block.get('data', ''))) * 3 // 4:,} bytes]")
    return "".join(parts)


SUMMARY_CHARS = 160


def _one_line(text: str) -> bool:
    return "\n" not in text.strip() and len(text) <= SUMMARY_CHARS


def call_summary(name: str, args: dict[str, Any]) -> str:
    """A tool call in a few words: its command or path."""
    for key in ("command", "path", "pattern", "query", "url"):
        if isinstance(args.get(key), str):
            text = " ".join(args[key].split())
            return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS - 1] + "…"
    text = json.dumps(args, ensure_ascii=False)
    return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS - 1] + "…"


class JobRenderer:
    """Renders the transcript's entries, in order, within the page's budget."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.used = 0
        self.parts: list[str] = []
        self.calls = 0             # tool calls seen
        self.compact_calls = 0     # ... shown as one line
        self.dropped_calls = 0     # ... not shown at all
        self.dropped_entries = 0

    def emit(self, html_text: str) -> None:
        self.parts.append(html_text)
        self.used += len(html_text)

    @property
    def mode(self) -> str:
        if self.used < self.limits.full_budget:
            return "full"
        return "compact" if self.used < self.limits.compact_budget else "none"

    def render(self, transcript: Transcript) -> str:
        turn: dict[str, Any] | None = None          # an assistant message waiting for its tool results
        results: dict[str, dict[str, Any]] = {}
        for entry in transcript.entries():
            message = entry.get("message") if entry.get("type") == "message" else None
            if isinstance(message, dict) and message.get("role") == "toolResult" and turn is not None:
                results[str(message.get("toolCallId"))] = message
                continue
            if turn is not None:
                self.assistant(turn, results)
                turn, results = None, {}
            if isinstance(message, dict) and message.get("role") == "assistant":
                turn = message
            else:
                self.entry(entry)
        if turn is not None:
            self.assistant(turn, results)
        if self.compact_calls or self.dropped_calls or self.dropped_entries:
            self.parts.append(
                f'<div class="note">The page stops showing details after {self.limits.full_budget:,} characters of '
                f"transcript: {self.compact_calls:,} later tool call(s) are listed one line each, "
                f"{self.dropped_calls:,} tool call(s) and {self.dropped_entries:,} other entries are not shown. "
                f"The whole transcript is in {SESSION}.</div>")
        if transcript.unreadable:
            self.parts.append(f'<div class="note">{transcript.unreadable:,} line(s) of {SESSION} are not JSON '
                              "and are not shown.</div>")
        hidden = transcript.total - len(transcript.chain)
        if hidden > 0:
            self.parts.append(f'<div class="note">{hidden:,} entries on other branches of the session are not '
                              "shown (only the current branch is).</div>")
        return "".join(self.parts)

    # -- entries ---------------------------------------------------------------------------------------------------

    def entry(self, entry: dict[str, Any]) -> None:
        if self.mode != "full":
            self.dropped_entries += 1
            return
        kind = entry.get("type")
        limits = self.limits
        if kind == "message" and isinstance(entry.get("message"), dict):
            self.message(entry["message"])
        elif kind == "compaction":
            tokens = fmt_int(entry.get("tokensBefore"))
            details = as_dict(entry.get("details"))
            files = "".join(f'<div class="dim">{label}: {esc(", ".join(str(p) for p in as_list(details.get(key))))}'
                            "</div>" for key, label in (("modifiedFiles", "modified"), ("readFiles", "read"))
                            if as_list(details.get(key)))
            self.emit(f'<details class="msg compaction"><summary>compaction · the history before this point was '
                      f'summarised ({tokens} tokens before)</summary>'
                      f'{pre(str(entry.get("summary", "")), limits.block)}{files}</details>')
        elif kind == "branch_summary":
            self.emit(f'<details class="msg branch-summary"><summary>branch summary</summary>'
                      f'{pre(str(entry.get("summary", "")), limits.block)}</details>')
        elif kind == "custom_message":
            self.emit(f'<div class="msg user"><div class="who">{esc(entry.get("customType", "message"))}</div>'
                      f'{text_html(content_text(entry.get("content")), limits)}</div>')
        elif kind == "model_change":
            self.emit(f'<div class="note">model: {esc(entry.get("provider", ""))} / '
                      f'{esc(entry.get("modelId", ""))}</div>')
        elif kind == "thinking_level_change":
            self.emit(f'<div class="note">thinking level: {esc(entry.get("thinkingLevel", ""))}</div>')
        elif kind in ("label", "session_info", "custom"):
            return
        else:
            self.emit(f'<div class="note">{esc(kind)} entry</div>')

    def message(self, message: dict[str, Any]) -> None:
        role = message.get("role")
        limits = self.limits
        if role == "user":
            self.emit(f'<div class="msg user"><div class="who">user</div>'
                      f'{text_html(content_text(message.get("content")), limits)}</div>')
        elif role == "toolResult":   # one whose call is not in the transcript
            self.emit(self.tool({"id": message.get("toolCallId"), "name": message.get("toolName", "?"),
                                 "arguments": {}}, message))
        elif role == "bashExecution":
            code = message.get("exitCode")
            self.emit(f'<div class="msg"><div class="who">user ran</div><pre>$ {esc(message.get("command", ""))}'
                      f'</pre><details><summary>output{f" · exit {esc(code)}" if code is not None else ""}</summary>'
                      f'{pre(str(message.get("output", "")), limits.block)}</details></div>')
        elif role in ("custom", "branchSummary", "compactionSummary"):
            text = content_text(message.get("content")) or str(message.get("summary", ""))
            self.emit(f'<div class="msg user"><div class="who">{esc(role)}</div>{text_html(text, limits)}</div>')
        else:
            self.emit(f'<div class="note">{esc(role)} message</div>')

    def assistant(self, message: dict[str, Any], results: dict[str, dict[str, Any]]) -> None:
        content = as_list(message.get("content"))
        blocks = [b for b in content if isinstance(b, dict)]
        calls = [b for b in blocks if b.get("type") == "toolCall"]
        if self.mode != "full":
            for call in calls:
                self.calls += 1
                if self.mode == "compact":
                    self.compact_calls += 1
                    self.emit(self.tool_line(call, results.get(str(call.get("id")))))
                else:
                    self.dropped_calls += 1
            self.dropped_entries += 1 + len(results)
            return
        limits = self.limits
        out = ['<div class="msg assistant"><div class="who">assistant</div>']
        for block in blocks:
            kind = block.get("type")
            if kind == "text":
                out.append(text_html(str(block.get("text", "")), limits))
            elif kind == "thinking":
                out.append(f'<details class="thinking"><summary>thinking</summary>'
                           f'{pre(str(block.get("thinking", "")), limits.block)}</details>')
            elif kind == "toolCall":
                self.calls += 1
                out.append(self.tool(block, results.pop(str(block.get("id")), None)))
        for orphan in results.values():   # a result whose call id matches no call of this turn
            out.append(self.tool({"id": orphan.get("toolCallId"), "name": orphan.get("toolName", "?"),
                                  "arguments": {}}, orphan))
        if message.get("errorMessage") or message.get("stopReason") in ("error", "aborted"):
            out.append(f'<div class="bad">{esc(message.get("stopReason", ""))}: '
                       f'{esc(clip(str(message.get("errorMessage", "")), limits.block)[0])}</div>')
        usage = as_dict(message.get("usage"))
        if usage:
            cost = as_dict(usage.get("cost"))
            out.append(f'<div class="dim" style="font-size:.8em">{esc(message.get("model", ""))} · in '
                       f'{fmt_int(usage.get("input"))} · out {fmt_int(usage.get("output"))} · '
                       f'{fmt_cost(cost.get("total"))}</div>')
        out.append("</div>")
        self.emit("".join(out))

    def tool(self, call: dict[str, Any], result: dict[str, Any] | None) -> str:
        limits = self.limits
        name = str(call.get("name", "?"))
        args = call.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = {"arguments": args}
        args = args if isinstance(args, dict) else {}
        is_error = bool(result and result.get("isError"))
        head = (f'<div class="tool-head">{esc(name)} <code>{esc(call_summary(name, args))}</code>'
                f'{" " + badge("error", "bad") if is_error else ""}</div>')
        body = self.arguments_html(name, args, result)
        if result is None:
            out = '<div class="dim">no result recorded</div>'
        else:
            text = content_text(result.get("content"))
            lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
            out = (f'<details class="output"><summary>output · {lines:,} line{"" if lines == 1 else "s"}'
                   f'</summary>{pre(text, limits.block)}</details>')
        return (f'<div class="tool{" error" if is_error else ""}" data-tool-call="{esc(call.get("id", ""))}" '
                f'data-tool="{esc(name)}">{head}{body}{out}</div>')

    def arguments_html(self, name: str, args: dict[str, Any], result: dict[str, Any] | None) -> str:
        limits = self.limits
        if name == "bash" and isinstance(args.get("command"), str):
            rest = {k: v for k, v in args.items() if k != "command"}
            command = args["command"]
            shown = "" if _one_line(command) else pre(command, limits.block, "cmd")
            return shown + (f'<div class="dim">{esc(json.dumps(rest, ensure_ascii=False))}</div>' if rest else "")
        if name == "edit":
            diff = edit_diff(args, result.get("details") if result else None)
            if diff:
                return diff_html(diff, limits.diff_lines)
        if name == "write" and "content" in args:
            return diff_html(write_diff(args), limits.diff_lines)
        if name == "read" and set(args) <= {"path", "offset", "limit"}:
            extra = " ".join(f"{k}={args[k]}" for k in ("offset", "limit") if k in args)
            return f'<div class="dim">{esc(extra)}</div>' if extra else ""
        if not args:
            return ""
        return pre(json.dumps(args, indent=2, ensure_ascii=False), limits.block, "args")

    def tool_line(self, call: dict[str, Any], result: dict[str, Any] | None) -> str:
        args = as_dict(call.get("arguments"))
        name = str(call.get("name", "?"))
        error = " " + badge("error", "bad") if result and result.get("isError") else ""
        return (f'<div class="tool compact" data-tool-call="{esc(call.get("id", ""))}" data-tool="{esc(name)}">'
                f'<span class="tool-head">{esc(name)}</span> <code>{esc(call_summary(name, args))}</code>{error}'
                "</div>")


# -- a job's directory ---------------------------------------------------------------------------------------------

def read_result(job_dir: str, limits: Limits = LIMITS) -> dict[str, Any] | None:
    """result.json as a dict, or None when it is missing, too large or not a JSON object."""
    path = os.path.join(job_dir, RESULT)
    try:
        if os.path.getsize(path) > limits.result_bytes:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            result = json.load(f)
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) else None


def read_patch(job_dir: str, limits: Limits) -> tuple[str | None, int]:
    """patch.diff (its head, up to limits.patch characters) and its size in bytes; None when absent."""
    path = os.path.join(job_dir, PATCH)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(limits.patch + 1)
        return text, os.path.getsize(path)
    except OSError:
        return None, 0


def render_job(job_dir: str, *, fallback: dict[str, Any] | None = None, back_link: str | None = None,
               limits: Limits = LIMITS) -> str:
    """The page for the job whose artifacts are in `job_dir` (result.json, session.jsonl, patch.diff; any may be
    missing). `fallback`: what is known of the job when result.json is missing (e.g. from the job store)."""
    stored = read_result(job_dir, limits)
    result = {**(fallback or {}), **(stored or {})}
    session_path = os.path.join(job_dir, SESSION)
    transcript_html = '<div class="dim">no transcript (session.jsonl is missing)</div>'
    renderer = JobRenderer(limits)
    if os.path.isfile(session_path):
        try:
            transcript = Transcript.read(session_path)
            if stored is None:   # the session's own numbers, under what the caller knows
                result = {**transcript.numbers(), **{k: v for k, v in result.items() if v is not None}}
            transcript_html = renderer.render(transcript) or '<div class="dim">the transcript is empty</div>'
        except OSError as exc:
            transcript_html = f'<div class="bad">cannot read {SESSION}: {esc(exc.strerror or exc)}</div>'
    job_id = str(result.get("id") or os.path.basename(os.path.abspath(job_dir)))
    patch, patch_size = read_patch(job_dir, limits)
    if patch is None:
        patch_html = '<div class="dim">no patch.diff</div>'
    elif not patch.strip():
        patch_html = '<div class="dim">the patch is empty: no change</div>'
    else:
        left = patch_size - len(patch.encode("utf-8", "replace")) if len(patch) > limits.patch else 0
        patch_html = diff_html(patch[:limits.patch], max_lines=max(limits.patch // 40, 100)) + omitted_note(
            max(left, 0), "bytes of patch.diff")
    back = f'<a href="{esc(back_link)}">← batch</a>' if back_link else ""
    nav = (f'<nav>{back}<a href="#transcript">transcript ({renderer.calls:,} tool calls)</a>'
           '<a href="#patch">patch</a></nav>')
    body = (f"{nav}<h1>pid job <code>{esc(job_id)}</code></h1>{header_html(result, limits)}"
            f'<h2 id="transcript">Transcript</h2>{transcript_html}'
            f'<h2 id="patch">Patch</h2>{patch_html}')
    return page(f"pid job {job_id}", body)


def write_page(path: str, text: str) -> None:
    """Written whole (a temporary file renamed over the target); lone surrogates from JSON become U+FFFD."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", errors="replace") as f:
        f.write(text)
    os.replace(tmp, path)
