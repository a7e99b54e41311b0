"""A job as one self-contained HTML page: its result (status, reason, model, usage, check), its transcript (every
message, every tool call with its arguments and collapsible output, edits as diffs, thinking, compactions) and its
patch. The building blocks (escaping, clipping, the page shell and its policy) are cli/pages/blocks.py's.

The page stays bounded whatever the session's size: the session is read in two passes (an index of entry offsets,
then only the entries on the current branch, one at a time), every block is clipped, and once the page holds
Limits.full_budget characters of transcript the later tool calls are listed one line each, up to
Limits.compact_budget; past that a note says how much is left out.
"""
from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator

from pid.cli.pages.blocks import (LIMITS, Limits, as_dict, as_list, badge, check_badge, clip, diff_html, esc,
                                  fmt_cost, fmt_duration, fmt_int, number, omitted_note, page, pre, status_class)
from pid.cli.pages.markdown import render as markdown

RESULT = "result.json"
SESSION = "session.jsonl"
PATCH = "patch.diff"


def json_or(text: str, fallback: Any) -> Any:
    """`text` as JSON, or `fallback` when it is not JSON (a model's arguments may be anything)."""
    try:
        return json.loads(text)
    except ValueError:
        return fallback


def edit_diff(arguments: dict[str, Any], details: Any) -> str:
    """An edit's change as a unified diff: the tool's own patch when it gave one, else from its arguments."""
    if isinstance(details, dict):
        for key in ("patch", "diff"):
            if isinstance(details.get(key), str) and details[key].strip():
                return str(details[key])
    path = str(arguments.get("path", "file"))
    edits = arguments.get("edits")
    if isinstance(edits, str):
        edits = json_or(edits, None)
    pairs = [e for e in edits if isinstance(e, dict)] if isinstance(edits, list) else []
    if "oldText" in arguments or "newText" in arguments:
        pairs.append(arguments)
    out: list[str] = []
    for i, pair in enumerate(pairs):
        old, new = str(pair.get("oldText", "")), str(pair.get("newText", ""))
        label = path if len(pairs) == 1 else f"{path} (edit {i + 1})"
        out.extend(difflib.unified_diff(old.splitlines(), new.splitlines(), label, label, lineterm="", n=3))
    return "\n".join(out)


def write_diff(arguments: dict[str, Any], before: str | None = None) -> str:
    """A write as a diff: against what this session wrote there before when it did (`before`), else its whole
    content, which may have replaced a file: nothing in the transcript says what was there."""
    content = str(arguments.get("content", ""))
    path = str(arguments.get("path", "file"))
    if before is not None:
        diff = list(difflib.unified_diff(before.splitlines(), content.splitlines(), path, path, lineterm="", n=3))
        return "\n".join(diff) if diff else f"@@ {path}: written again, unchanged @@"
    lines = content.splitlines()
    return "\n".join([f"+++ {path}", f"@@ written whole: {len(lines):,} line{'' if len(lines) == 1 else 's'} (what it "
                      "replaced, if anything, is not in the transcript) @@", *("+" + line for line in lines)])


KNOWN_WRITE_MAX = 64 << 10   # a write's content kept to diff the next write of its path against, at most...
KNOWN_WRITES = 256           # ...for this many paths


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


ARTIFACTS_LISTED = 50   # collected files and refusals shown (each list), the rest counted


def artifacts_html(artifacts: dict[str, Any], limits: Limits) -> str:
    """The files collected (--file) and what was left out of the patch or the files, with why (a new user's: the page
    showed neither, only `pid result` did)."""
    files = [f for f in artifacts.get("files") or [] if isinstance(f, str)]
    refused = [r for r in artifacts.get("refused") or [] if isinstance(r, dict)]
    parts = []
    if files:
        shown = ", ".join(f"<code>{esc(clip(f, 300)[0])}</code>" for f in files[:ARTIFACTS_LISTED])
        parts.append(f"<div>collected: {shown}{_more(len(files))}</div>")
    if refused:
        items = "".join(f'<li><code>{esc(clip(str(r.get("path", "?")), 300)[0])}</code> '
                        f'<span class="dim">({esc(str(r.get("artifact", "")))})</span>: '
                        f'{esc(clip(str(r.get("reason", "")), 500)[0])}</li>' for r in refused[:ARTIFACTS_LISTED])
        parts.append(f'<div class="warn">left out:</div><ul class="refused">{items}</ul>{_more(len(refused))}')
    return "".join(parts)


def _more(count: int) -> str:
    return f' <span class="dim">and {count - ARTIFACTS_LISTED:,} more</span>' if count > ARTIFACTS_LISTED else ""


def header_html(result: dict[str, Any], limits: Limits, relatives: str = "") -> str:
    """The result's facts; `relatives`: rows (dt, dd) of the jobs it is related to, first."""
    usage = as_dict(result.get("usage"))
    status = result.get("status", "unknown")
    rows: list[tuple[str, str]] = [
        ("status", badge(status, status_class(status)) + (f' <span class="dim">{esc(result["exit_reason"])}</span>'
                                                           if result.get("exit_reason") else "")),
        ("model", esc(result.get("model") or "—")),
        ("tokens", f'{fmt_int(usage.get("total_tokens"))} <span class="dim">(in {fmt_int(usage.get("input"))}, out '
                   f'{fmt_int(usage.get("output"))}, cache read {fmt_int(usage.get("cache_read"))})'
                   + ('; estimated by pid: the server reported none' if usage.get("estimated") else '') + '</span>'),
        ("cost", fmt_cost(usage.get("cost"))),
        ("duration", fmt_duration(result.get("duration_s"))),
        ("turns", f'{fmt_int(result.get("turns"))} <span class="dim">· {fmt_int(result.get("tool_calls"))} tool '
                  f'call{"" if result.get("tool_calls") == 1 else "s"}</span>'),
    ]
    if "check" in result:
        rows.append(("check", check_html(result.get("check"), limits) or '<span class="dim">—</span>'))
    left_out = artifacts_html(as_dict(result.get("artifacts")), limits)
    if left_out:
        rows.append(("artifacts", left_out))
    for key in ("repo", "image", "started_at", "finished_at"):
        if result.get(key):
            rows.append((key.replace("_", " "), esc(result[key])))
    if result.get("error"):
        rows.append(("error", f'<span class="bad">{esc(clip(str(result["error"]), limits.block)[0])}</span>'))
    body = relatives + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    out = f'<dl class="meta">{body}</dl>'
    if result.get("task"):
        out += f'<h2>Task</h2><div class="msg user">{text_html(str(result["task"]), limits)}</div>'
    if result.get("final_message"):
        out += f'<h2>Final message</h2><div class="msg">{markdown_html(str(result["final_message"]), limits)}</div>'
    return out


def text_html(text: str, limits: Limits) -> str:
    return f'<div class="text">{esc(clip(text, limits.block)[0])}</div>'


def markdown_html(text: str, limits: Limits) -> str:
    """The assistant's text, as the Markdown it is written in (cli/pages/markdown.py's strict subset)."""
    return f'<div class="md">{markdown(clip(text, limits.block)[0])}</div>'


def moment_ms(value: Any) -> float | None:
    """A session's time as milliseconds since the epoch: a message's `timestamp` (ms) or an entry's (ISO 8601)."""
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp() * 1000
    return number(value)


def when_html(started_ms: float | None, ended_ms: float | None) -> str:
    """A tool call's time (UTC, when its turn's reply was recorded: the calls of a turn start together) and how
    long it took (until its result was recorded)."""
    if started_ms is None:
        return ""
    try:
        moment = datetime.fromtimestamp(started_ms / 1000, timezone.utc)
    except (OverflowError, OSError, ValueError):
        return ""
    iso = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    out = f'<time datetime="{esc(iso)}" title="{esc(iso)}">{moment:%H:%M:%S}</time>'
    if ended_ms is not None and ended_ms >= started_ms:
        took = (ended_ms - started_ms) / 1000
        out += f' · <span class="took">{f"{took * 1000:.0f} ms" if took < 1 else fmt_duration(took)}</span>'
    return f' <span class="when">{out}</span>'


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
        self.at: dict[int, float | None] = {}   # when each message of the current turn was recorded (by id())
        self.written: dict[str, str] = {}   # what this session's last write put in a path, where it is known whole

    def known_before(self, name: str, args: dict[str, Any], result: dict[str, Any] | None) -> str | None:
        """For a write: what this session's earlier write left in its path, if nothing has changed it since; then
        what this call leaves there is noted (an edit's is not known whole)."""
        path = args.get("path")
        if name not in ("write", "edit") or not isinstance(path, str):
            return None
        before = self.written.pop(path, None)
        content = args.get("content")
        if (name == "write" and isinstance(content, str) and len(content) <= KNOWN_WRITE_MAX and result is not None
                and not result.get("isError")):
            self.written[path] = content
            while len(self.written) > KNOWN_WRITES:
                self.written.pop(next(iter(self.written)))
        elif result is not None and result.get("isError"):   # (nothing changed)
            if before is not None:
                self.written[path] = before
        return before if name == "write" else None

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
            if isinstance(message, dict):
                recorded = moment_ms(entry.get("timestamp"))
                self.at[id(message)] = recorded if recorded is not None else moment_ms(message.get("timestamp"))
            if isinstance(message, dict) and message.get("role") == "toolResult" and turn is not None:
                results[str(message.get("toolCallId"))] = message
                continue
            if turn is not None:
                self.assistant(turn, results)
                turn, results = None, {}
                self.at = {k: v for k, v in self.at.items() if k == id(message)}
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
                out.append(markdown_html(str(block.get("text", "")), limits))
            elif kind == "thinking":
                out.append(f'<details class="thinking"><summary>thinking</summary>'
                           f'{pre(str(block.get("thinking", "")), limits.block)}</details>')
            elif kind == "toolCall":
                self.calls += 1
                out.append(self.tool(block, results.pop(str(block.get("id")), None), self.at.get(id(message))))
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

    def tool(self, call: dict[str, Any], result: dict[str, Any] | None, started_ms: float | None = None) -> str:
        """One call: its name, summary, time and duration, arguments (edits as diffs) and output. A failed edit or
        write changed nothing: it says "not applied", and a failed call's output is open, since it says why."""
        limits = self.limits
        name = str(call.get("name", "?"))
        args = call.get("arguments")
        if isinstance(args, str):
            args = json_or(args, {"arguments": args})
        args = args if isinstance(args, dict) else {}
        is_error = bool(result and result.get("isError"))
        not_applied = is_error and name in ("edit", "write")
        mark = badge("not applied", "bad not-applied") if not_applied else badge("error", "bad") if is_error else ""
        ended = self.at.get(id(result)) if result is not None else None
        head = (f'<div class="tool-head">{esc(name)} <code>{esc(call_summary(name, args))}</code>'
                f'{" " + mark if mark else ""}{when_html(started_ms, ended)}</div>')
        body = self.arguments_html(name, args, result, self.known_before(name, args, result))
        if not_applied and body:
            body = f'<div class="not-applied-change" title="not applied: the file was not changed">{body}</div>'
        if result is None:
            out = '<div class="dim">no result recorded</div>'
        else:
            text = content_text(result.get("content"))
            lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
            what = "error" if is_error else "output"
            out = (f'<details class="output"{" open" if is_error else ""}><summary>{what} · {lines:,} '
                   f'line{"" if lines == 1 else "s"}</summary>{pre(text, limits.block)}</details>')
        return (f'<div class="tool{" error" if is_error else ""}" data-tool-call="{esc(call.get("id", ""))}" '
                f'data-tool="{esc(name)}">{head}{body}{out}</div>')

    def arguments_html(self, name: str, args: dict[str, Any], result: dict[str, Any] | None,
                       before: str | None = None) -> str:
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
            return diff_html(write_diff(args, before), limits.diff_lines)
        if name == "read" and set(args) <= {"path", "offset", "limit"}:
            extra = " ".join(f"{k}={args[k]}" for k in ("offset", "limit") if k in args)
            return f'<div class="dim">{esc(extra)}</div>' if extra else ""
        if not args:
            return ""
        return pre(json.dumps(args, indent=2, ensure_ascii=False), limits.block, "args")

    def tool_line(self, call: dict[str, Any], result: dict[str, Any] | None) -> str:
        args = as_dict(call.get("arguments"))
        name = str(call.get("name", "?"))
        self.known_before(name, args, result)   # (a write shown as one line still changes what the next one is against)
        error = ""
        if result and result.get("isError"):
            failed = badge("not applied", "bad not-applied") if name in ("edit", "write") else badge("error", "bad")
            error = " " + failed
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


@dataclass
class Relative:
    """A job linked from this one's page: the one it continues (`parent`), runs again (`retry of`), or one that
    continues it (`continued by`). `page`: its page's file name beside this one, when there is one."""
    role: str
    job_id: str
    page: str | None = None


def relatives_html(relatives: list[Relative]) -> str:
    """Each as a link to its page, or (no page here) its id and the command that makes one."""
    rows: dict[str, list[str]] = {}
    for r in relatives:
        if r.page:
            shown = f'<a href="{esc(r.page)}" data-relation="{esc(r.role)}"><code>{esc(r.job_id)}</code></a>'
        else:
            shown = (f'<code data-relation="{esc(r.role)}">{esc(r.job_id)}</code> '
                     f'<span class="dim">(pid view {esc(r.job_id)})</span>')
        rows.setdefault(r.role, []).append(shown)
    return "".join(f"<dt>{esc(role)}</dt><dd>{', '.join(links)}</dd>" for role, links in rows.items())


def render_job(job_dir: str, *, fallback: dict[str, Any] | None = None, back_link: str | None = None,
               limits: Limits = LIMITS, relatives: list[Relative] | None = None, refresh_s: int | None = None) -> str:
    """The page for the job whose artifacts are in `job_dir` (result.json, session.jsonl, patch.diff; any may be
    missing). `fallback`: what is known of the job when result.json is missing (e.g. from the job store).
    `relatives`: the jobs to link (else its parent and retried job as result.json names them, without a page).
    `refresh_s`: the page reloads itself that often (`pid view --watch` rewrites it while the job runs)."""
    stored = read_result(job_dir, limits)
    result = {**(fallback or {}), **(stored or {})}
    if relatives is None:
        relatives = [Relative(role, str(result[key])) for key, role in (("parent", "continues"),
                                                                       ("retry_of", "retry of"))
                     if isinstance(result.get(key), str) and result[key]]
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
    calls = f'{renderer.calls:,} tool call{"" if renderer.calls == 1 else "s"}'
    nav = f'<nav>{back}<a href="#transcript">transcript ({calls})</a><a href="#patch">patch</a></nav>'
    live = (f'<div class="note live">live: this page reloads every {refresh_s} s while the job runs '
            "(pid view --watch rewrites it)</div>" if refresh_s else "")
    body = (f"{nav}<h1>pid job <code>{esc(job_id)}</code></h1>{live}"
            f"{header_html(result, limits, relatives_html(relatives))}"
            f'<h2 id="transcript">Transcript</h2>{transcript_html}'
            f'<h2 id="patch">Patch</h2>{patch_html}')
    return page(f"pid job {job_id}", body, refresh_s=refresh_s)
