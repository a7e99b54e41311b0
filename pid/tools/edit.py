"""edit: replace unique spans of a file, all matched against the original and applied together.

Bytes outside the replaced spans are never touched: line endings, a BOM, invalid UTF-8 and the lines around a fuzzy
match all survive (the file is decoded with surrogateescape so it round-trips exactly).
"""
from __future__ import annotations

import difflib
import errno
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from pid.tools.base import Tool, ToolContext, ToolResult
from pid.tools.fuzzy import LineEndings, NormalizedText, find_unique, normalize_fuzzy
from pid.tools.paths import ABORTED, EMPTY_PATH, display_path, file_error, mutation_lock, resolve_path
from pid.tools.truncate import format_size

EDIT_CAP = 8 * 1024 * 1024
BOM = "\ufeff"
HINT_LINE_CHARS = 200

DESCRIPTION = (
    "Edit a file by replacing exact text. Each edits[].oldText must match one unique span of the original file, "
    "including whitespace and indentation; include enough surrounding lines to make it unique. All edits are "
    "matched against the original file (not after earlier edits), must not overlap, and are applied together. "
    "Use write to create a file or replace it entirely.")

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "Path to the file to edit (relative or absolute)"},
        "edits": {
            "type": "array",
            "description": "Replacements to apply, each matched against the original file",
            "items": {
                "type": "object",
                "properties": {
                    "oldText": {"type": "string", "description": "Exact text to find (must be unique in the file)"},
                    "newText": {"type": "string", "description": "Text to replace it with"},
                },
                "required": ["oldText", "newText"],
            },
        },
    },
    "required": ["path", "edits"],
}


def edit_tool() -> Tool:
    return Tool("edit", DESCRIPTION, PARAMETERS, run_edit, prepare=accept_legacy_arguments)


def accept_legacy_arguments(args: dict[str, Any]) -> dict[str, Any]:
    """Top-level oldText/newText (the older single-edit shape) become one more entry of `edits`."""
    if "oldText" not in args and "newText" not in args:
        return args
    edits = args.get("edits", [])
    if isinstance(edits, str):
        try:
            edits = json.loads(edits)
        except ValueError:
            return args  # leave it to validation to report
    if not isinstance(edits, list):
        return args
    legacy = {k: args.pop(k) for k in ("oldText", "newText") if k in args}
    args["edits"] = edits + [legacy]
    return args


@dataclass
class _Planned:
    index: int
    start: int   # span in the BOM-less original text
    end: int
    new_text: str


def run_edit(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    shown = display_path(args["path"])
    if not shown.strip():
        return ToolResult.error(EMPTY_PATH)
    edits: list[dict[str, str]] = args["edits"]
    if not edits:
        return ToolResult.error("Edit tool input is invalid. edits must contain at least one replacement.")
    path = resolve_path(ctx.sandbox, args["path"])
    try:
        with mutation_lock(ctx, path):
            # pi checks for a cancel after every step; the lock is held until the step in flight has ended.
            if ctx.cancel.is_set():
                return ToolResult.error(ABORTED)
            try:
                data = ctx.sandbox.read_file(path, max_bytes=EDIT_CAP + 1, cancel=ctx.cancel)
            except OSError as exc:
                return _io_error(exc, shown, path, "read")
            if ctx.cancel.is_set():
                return ToolResult.error(ABORTED)
            if len(data) > EDIT_CAP:
                return ToolResult.error(f"{shown} is over {format_size(EDIT_CAP)}, too large to edit. "
                                        f"Use bash (e.g. sed or a script) instead.")
            text = data.decode("utf-8", "surrogateescape")
            bom = BOM if text.startswith(BOM) else ""
            original = text[len(bom):]

            planned, errors = _plan(original, edits, shown)
            if errors:
                if len(edits) > 1:
                    errors.append(f"None of the {len(edits)} edits were applied.")
                return ToolResult.error("\n\n".join(errors))

            result = original
            for p in sorted(planned, key=lambda p: p.start, reverse=True):
                result = result[:p.start] + p.new_text + result[p.end:]
            new_data = (bom + result).encode("utf-8", "surrogateescape")
            if new_data == data:
                return ToolResult.error(f"No changes made to {shown}. The replacement produced identical content.")
            try:
                ctx.sandbox.write_file(path, new_data, cancel=ctx.cancel)
            except OSError as exc:
                return _io_error(exc, shown, path, "write")
            if ctx.cancel.is_set():
                return ToolResult.error(ABORTED)
    except InterruptedError:   # cancelled while the lock's key (the real path) was being found
        return ToolResult.error(ABORTED)

    diff, first_changed = _diff(original, result, shown)
    return ToolResult.text(f"Successfully replaced {len(edits)} block(s) in {shown}.",
                           details={"diff": diff, "patch": unified_patch(shown, bom + original, bom + result),
                                    "firstChangedLine": first_changed})


def _io_error(exc: OSError, shown: str, path: str, op: str) -> ToolResult:
    """pi's wording: a file that cannot be reached is `Could not edit file: P. Error code: CODE.`; any other I/O
    error is the system's message. pid's own refusals (a FIFO or device, a sandbox timeout) keep pid's wording."""
    if isinstance(exc, InterruptedError):
        return ToolResult.error(ABORTED)
    if isinstance(exc, TimeoutError) or exc.errno in (None, errno.EINVAL):
        return file_error(exc, shown)
    code = errno.errorcode.get(exc.errno, str(exc.errno))
    if isinstance(exc, (FileNotFoundError, PermissionError, NotADirectoryError)):
        return ToolResult.error(f"Could not edit file: {shown}. Error code: {code}.")
    return ToolResult.error(f"{code}: {os.strerror(exc.errno)}, {op} '{path}'")


_LINE = re.compile(r"[^\n]*\n|[^\n]+")


def unified_patch(shown: str, old: str, new: str, context: int = 4) -> str:
    """A standard unified patch (pi's `details.patch`: `--- path`/`+++ path` headers, 4 lines of context) made from
    the file's real text, line endings and BOM included, so that it applies to the original file as it was."""
    out = []
    for line in difflib.unified_diff(_LINE.findall(old), _LINE.findall(new), shown, shown, n=context):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out).encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _plan(original: str, edits: list[dict[str, str]], shown: str) -> tuple[list[_Planned], list[str]]:
    """Locate every edit in the original; the spans, or one message per problem."""
    endings = LineEndings(original)
    several = len(edits) > 1
    normalized: NormalizedText | None = None
    planned: list[_Planned] = []
    errors: list[str] = []
    for i, edit in enumerate(edits):
        prefix = f"edits[{i}]: " if several else ""
        old = edit["oldText"].replace("\r\n", "\n")
        if not old:
            errors.append(f"{prefix}oldText must not be empty in {shown}.")
            continue
        match, normalized = find_unique(endings.lf, old, normalized)
        if match.count == 0:
            errors.append(f"{prefix}Could not find the exact text in {shown}. The old text must match exactly "
                          f"including all whitespace and newlines.\n\n" + _closest_hint(endings.lf, old))
        elif match.count > 1:
            errors.append(f"{prefix}Found {match.count} occurrences of the text in {shown}. The text must be "
                          f"unique. Please provide more context to make it unique.")
        else:
            assert match.span is not None
            start, end = endings.to_original(match.span)
            planned.append(_Planned(i, start, end, endings.restore(edit["newText"])))
    ordered = sorted(planned, key=lambda p: (p.start, p.end))
    for a, b in zip(ordered, ordered[1:]):
        if b.start < a.end:
            first, second = sorted((a.index, b.index))
            errors.append(f"edits[{first}] and edits[{second}] overlap in {shown}. Merge them into one edit or "
                          f"target disjoint regions.")
    return planned, errors


def _numbered(lines: list[str], first: int) -> str:
    width = len(str(first + len(lines) - 1))
    out = []
    for n, line in enumerate(lines, first):
        if len(line) > HINT_LINE_CHARS:
            line = line[:HINT_LINE_CHARS] + "..."
        out.append(f"{n:>{width}}\t{line}")
    return "\n".join(out)


def _closest_hint(lf_text: str, old: str) -> str:
    """Where the model probably meant: the file line most like oldText's first non-blank line, with context."""
    file_lines = lf_text.split("\n")
    old_lines = old.split("\n")
    anchor_at = next((k for k, line in enumerate(old_lines) if line.strip()), 0)
    anchor = normalize_fuzzy(old_lines[anchor_at]).strip()
    best, best_score = -1, 0.0
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(anchor)
    for n, line in enumerate(file_lines):
        candidate = normalize_fuzzy(line).strip() if not line.isascii() else line.strip()
        matcher.set_seq1(candidate)
        if matcher.real_quick_ratio() <= best_score or matcher.quick_ratio() <= best_score:
            continue
        score = matcher.ratio()
        if score > best_score:
            best, best_score = n, score
    if best < 0 or best_score < 0.6:
        return "File starts with:\n" + _numbered(file_lines[:5], 1)
    top = max(best - anchor_at, 0)
    span = min(max(len(old_lines), 1) + 2, 10)
    return f"Closest match is around line {top + 1}:\n" + _numbered(file_lines[top:top + span], top + 1)


def _diff(old: str, new: str, shown: str) -> tuple[str, int | None]:
    old_lines = old.replace("\r\n", "\n").split("\n")
    new_lines = new.replace("\r\n", "\n").split("\n")
    diff = "\n".join(difflib.unified_diff(old_lines, new_lines, f"a/{shown}", f"b/{shown}", lineterm=""))
    first = next((k + 1 for k, (a, b) in enumerate(zip(old_lines, new_lines)) if a != b), None)
    if first is None and len(old_lines) != len(new_lines):
        first = min(len(old_lines), len(new_lines)) + 1
    return diff, first
