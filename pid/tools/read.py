"""read: a file's text (at most 2000 lines / 50KB per call, continued with offset) or an image.

Files up to READ_CAP bytes are read once and sliced here; bigger ones are never loaded whole: the line total and the
requested slice come from `wc`/`tail`/`head` run inside the sandbox, so a 2 GB log costs a few KB of memory.
"""
from __future__ import annotations

import base64
import codecs
import shlex
from typing import Any

from pid.messages import ImageContent, TextContent
from pid.sandbox_api import OutputPolicy, RUN_ANYWHERE
from pid.tools.base import Tool, ToolContext, ToolResult
from pid.tools.bmp import BmpError, PngTooLarge, bmp_to_png, looks_like_bmp
from pid.tools.paths import ABORTED, EMPTY_PATH, display_path, file_error, resolve_path, with_read_fallback
from pid.tools.truncate import MAX_BYTES, MAX_LINES, format_size, split_lines, truncate_head, utf8_len

READ_CAP = 8 * 1024 * 1024       # files up to this size are read whole
IMAGE_MAX_BYTES = 5 * 1024 * 1024  # providers reject bigger images
BINARY_SNIFF_BYTES = 8192

DESCRIPTION = (
    f"Read the contents of a file. Supports text files and images (png, jpeg, gif, webp, and bmp converted to png; "
    f"sent as attachments). "
    f"Text output is limited to {MAX_LINES} lines or {MAX_BYTES // 1024}KB, whichever is hit first; use offset "
    f"(1-indexed line number) and limit to read large files in parts, continuing with the offset given in the notice.")

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "Path to the file to read (relative or absolute)"},
        "offset": {"type": "integer", "minimum": 0, "description": "Line number to start reading from (1-indexed)"},
        "limit": {"type": "integer", "minimum": 1, "description": "Maximum number of lines to read"},
    },
    "required": ["path"],
}

_IMAGE_MAGIC: list[tuple[bytes, str]] = [
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
]

_BINARY_MAGIC: list[tuple[bytes, str]] = [
    (b"\x7fELF", "ELF executable"),
    (b"PK\x03\x04", "zip archive"),
    (b"\x1f\x8b", "gzip compressed data"),
    (b"BZh", "bzip2 compressed data"),
    (b"\xfd7zXZ\x00", "xz compressed data"),
    (b"\x28\xb5\x2f\xfd", "zstd compressed data"),
    (b"7z\xbc\xaf\x27\x1c", "7-zip archive"),
    (b"%PDF", "PDF document"),
    (b"SQLite format 3\x00", "SQLite database"),
    (b"\x00asm", "WebAssembly module"),
    (b"\xca\xfe\xba\xbe", "Java class or Mach-O universal binary"),
    (b"\xcf\xfa\xed\xfe", "Mach-O executable"),
    (b"MZ", "Windows executable"),
    (b"BM", "BMP image of an unknown variant"),
    (b"II*\x00", "TIFF image (not a supported image format)"),
    (b"MM\x00*", "TIFF image (not a supported image format)"),
    (b"\xff\xfe", "UTF-16 text"),
    (b"\xfe\xff", "UTF-16 text"),
]


def image_mime(head: bytes) -> str | None:
    """The image type by magic bytes (never by extension)."""
    for magic, mime in _IMAGE_MAGIC:
        if head.startswith(magic):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def guess_binary_type(head: bytes) -> str:
    if head[257:262] == b"ustar":
        return "tar archive"
    for magic, kind in _BINARY_MAGIC:
        if head.startswith(magic):
            return kind
    return "unknown binary data"


def looks_binary(head: bytes, whole_file: bool) -> bool:
    """NUL bytes or invalid UTF-8 in the first 8KB (a character cut at the sample's end is not invalid)."""
    sample = head[:BINARY_SNIFF_BYTES]
    if b"\x00" in sample:
        return True
    try:
        codecs.getincrementaldecoder("utf-8")().decode(sample, final=whole_file and len(head) <= len(sample))
    except UnicodeDecodeError:
        return True
    return False


def read_tool() -> Tool:
    return Tool("read", DESCRIPTION, PARAMETERS, run_read)


def run_read(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    shown = display_path(args["path"])
    if not shown.strip():
        return ToolResult.error(EMPTY_PATH)
    if ctx.cancel.is_set():
        return ToolResult.error(ABORTED)
    offset: int | None = args.get("offset")
    limit: int | None = args.get("limit")
    try:
        path, head = with_read_fallback(
            resolve_path(ctx.sandbox, args["path"]),
            lambda p: ctx.sandbox.read_file(p, max_bytes=READ_CAP + 1, cancel=ctx.cancel))
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and args["path"] in ctx.full_outputs:
            return ToolResult.error(f"File not found: {shown} (an earlier command's full output: the sandbox keeps "
                                    f"only the newest ones, and has removed this one)")
        return file_error(exc, shown, " Use bash with ls to list its contents.")
    whole = len(head) <= READ_CAP

    mime = image_mime(head[:16])
    if mime:
        if not whole or len(head) > IMAGE_MAX_BYTES:
            size = len(head) if whole else _file_size(ctx, path)
            return ToolResult.error(f"Image {shown} is {format_size(size)}, over the "
                                    f"{format_size(IMAGE_MAX_BYTES)} limit for images.")
        return ToolResult([TextContent(f"Read image file [{mime}]"),
                           ImageContent(base64.b64encode(head).decode("ascii"), mime)])
    if looks_like_bmp(head):
        if not whole:
            return ToolResult.error(f"Image {shown} is {format_size(_file_size(ctx, path))}, over the "
                                    f"{format_size(READ_CAP)} limit for BMP images.")
        return _read_bmp(shown, head)

    if looks_binary(head, whole):
        size = len(head) if whole else _file_size(ctx, path)
        return ToolResult.error(f"Cannot display binary file {shown} ({format_size(size)}, "
                                f"{guess_binary_type(head)}). Use bash to inspect it (e.g. file, xxd, strings).")

    # Lines as pi 0.8x counts them (split_lines): a final newline ends the last line, an empty file has none. A
    # slice that reaches the end of the file keeps the file's final newline, so a whole read is the file exactly.
    start = max(offset or 1, 1)
    if whole:
        body = head.decode("utf-8", "replace")
        lines = split_lines(body)
        total, final_newline = len(lines), body.endswith("\n")
        selected = lines[start - 1:start - 1 + limit] if limit else lines[start - 1:]
        first_line_size = lambda: utf8_len(lines[start - 1])  # noqa: E731
    else:
        total, final_newline, selected = _slice_via_exec(ctx, path, start, limit)
        first_line_size = lambda: _line_size_via_exec(ctx, path, start)  # noqa: E731

    if start > total and not (total == 0 and start == 1):
        return ToolResult.error(f"Offset {offset} is beyond end of file ({total} lines total)")
    selected_lines = min(limit, total - start + 1) if limit else total - start + 1
    ending = "\n" if final_newline and start - 1 + selected_lines == total else ""
    # The slice's size is known only when it was read whole (a huge file's is read only as far as the caps need).
    selected_bytes = utf8_len("\n".join(selected)) + len(ending) if whole else None
    return _render(shown, start, total, selected, selected_lines, selected_bytes, limit, first_line_size, ending)


def _render(shown: str, start: int, total: int, selected: list[str], selected_lines: int,
            selected_bytes: int | None, limit: int | None, first_line_size: Any, ending: str) -> ToolResult:
    cut = truncate_head(selected)
    details = {"truncation": {
        "truncated": True, "truncatedBy": cut.truncated_by, "totalLines": selected_lines,
        "totalBytes": selected_bytes, "outputLines": cut.output_lines, "outputBytes": utf8_len(cut.content),
        "lastLinePartial": False, "firstLineExceedsLimit": cut.first_line_exceeds,
        "maxLines": MAX_LINES, "maxBytes": MAX_BYTES}}
    if cut.first_line_exceeds:
        return ToolResult.text(f"[Line {start} is {format_size(first_line_size())}, exceeds {format_size(MAX_BYTES)} "
                               f"limit. Use bash: sed -n '{start}p' {shlex.quote(shown)} | head -c {MAX_BYTES}]",
                               details=details)
    end = start + cut.output_lines - 1
    if cut.truncated_by == "lines":
        return ToolResult.text(cut.content + f"\n\n[Showing lines {start}-{end} of {total}. Use offset={end + 1} "
                                             f"to continue.]", details=details)
    if cut.truncated_by == "bytes":
        return ToolResult.text(cut.content + (f"\n\n[Showing lines {start}-{end} of {total} "
                                              f"({format_size(MAX_BYTES)} limit). Use offset={end + 1} to continue.]"),
                               details=details)
    if limit is not None and end < total:
        return ToolResult.text(cut.content + f"\n\n[{total - end} more lines in file. Use offset={end + 1} "
                                             f"to continue.]")
    return ToolResult.text(cut.content + ending)


def _read_bmp(shown: str, data: bytes) -> ToolResult:
    """A BMP goes to the model as PNG (models take png, jpeg, gif and webp), as pi converts it. It is converted in
    the worker, so its size (at most READ_CAP) bounds the work (see bmp.py), and a PNG over the image limit ends
    it early."""
    try:
        png = bmp_to_png(data, max_png=IMAGE_MAX_BYTES)
    except PngTooLarge:
        return ToolResult.error(f"Image {shown} is over the {format_size(IMAGE_MAX_BYTES)} limit for images as PNG.")
    except BmpError as exc:
        return ToolResult.error(f"Cannot convert BMP image {shown} to PNG: {exc}. Convert it with bash (e.g. to PNG) "
                                f"and read that.")
    if len(png) > IMAGE_MAX_BYTES:
        return ToolResult.error(f"Image {shown} is {format_size(len(png))} as PNG, over the "
                                f"{format_size(IMAGE_MAX_BYTES)} limit for images.")
    return ToolResult([TextContent("Read image file [image/png]"),
                       ImageContent(base64.b64encode(png).decode("ascii"), "image/png")])


def _exec_checked(ctx: ToolContext, command: str) -> bytes:
    result = ctx.sandbox.exec(RUN_ANYWHERE + command, timeout=ctx.settings.bash_timeout_s,
                              output=OutputPolicy(tail_bytes=MAX_BYTES + 16 * 1024), cancel=ctx.cancel)
    if result.cancelled:
        raise RuntimeError(ABORTED)
    if result.exit_code != 0:
        reason = "timed out" if result.timed_out else \
            result.tail.decode("utf-8", "replace").strip() or f"exit code {result.exit_code}"
        raise RuntimeError(f"Could not read the file: {reason}")
    return result.tail


def _file_size(ctx: ToolContext, path: str) -> int:
    return int(_exec_checked(ctx, f"wc -c < {shlex.quote(path)}").strip())


# `head` closing the pipe early makes `tail` die of SIGPIPE: not an error, even where pipefail is on by default.
_NO_PIPEFAIL = "set +o pipefail 2>/dev/null; "

# Lines the way pi 0.8x counts them: the newlines, plus one for a last line without a final newline (the file is
# never empty here). Then whether the file ends with a newline. A file gone since its head was read (the agent's
# processes run on) fails the command, rather than putting the shell's complaint where the count goes.
_COUNT_LINES = 'n=$(wc -l < "$f") || exit 1; e=$(tail -c 1 "$f" | wc -l); echo "$((n + 1 - e)) $e"'


def _slice_via_exec(ctx: ToolContext, path: str, start: int, limit: int | None) -> tuple[int, bool, list[str]]:
    """(line total, whether the file ends with a newline, lines from `start`) for a file too big to read whole: at
    most MAX_LINES+1 lines and a little over MAX_BYTES, enough for truncate_head to tell which cap was hit without
    ever holding more."""
    max_lines = min(limit, MAX_LINES + 1) if limit else MAX_LINES + 1
    command = (f"{_NO_PIPEFAIL}f={shlex.quote(path)}; {_COUNT_LINES}; "
               f"tail -n +{start} \"$f\" | head -n {max_lines} | head -c {MAX_BYTES + 2}")
    out = _exec_checked(ctx, command)
    counts, _, rest = out.partition(b"\n")
    total, ends = (int(n) for n in counts.split())
    # What `head -n` cut ends with a newline that starts no line of the file: keep only the lines that exist.
    return total, ends == 1, rest.decode("utf-8", "replace").split("\n")[:max(0, min(max_lines, total - start + 1))]


def _line_size_via_exec(ctx: ToolContext, path: str, line: int) -> int:
    out = _exec_checked(ctx, f"{_NO_PIPEFAIL}tail -n +{line} {shlex.quote(path)} | head -n 1 | tr -d '\\n' | wc -c")
    return int(out.strip())
