"""write: create or overwrite a file with the given text (parent directories created)."""
from __future__ import annotations

from typing import Any

from pid.tools.base import Tool, ToolContext, ToolResult
from pid.tools.paths import ABORTED, EMPTY_PATH, display_path, file_error, mutation_lock, resolve_path

DESCRIPTION = ("Write content to a file. Creates the file if it does not exist, overwrites it if it does, and "
               "creates parent directories. Use edit for changes to part of an existing file.")

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "Path to the file to write (relative or absolute)"},
        "content": {"type": "string", "description": "Content to write to the file"},
    },
    "required": ["path", "content"],
}


def write_tool() -> Tool:
    return Tool("write", DESCRIPTION, PARAMETERS, run_write)


def run_write(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    shown = display_path(args["path"])
    if not shown.strip():
        return ToolResult.error(EMPTY_PATH)
    path = resolve_path(ctx.sandbox, args["path"])
    data = args["content"].encode("utf-8")
    try:
        with mutation_lock(ctx, path):
            # Like pi: a cancel seen before or after the write fails the call (the write itself is never cut short
            # by a released lock).
            if ctx.cancel.is_set():
                return ToolResult.error(ABORTED)
            ctx.sandbox.write_file(path, data, cancel=ctx.cancel)
            if ctx.cancel.is_set():
                return ToolResult.error(ABORTED)
    except OSError as exc:
        return file_error(exc, shown)
    return ToolResult.text(f"Successfully wrote {len(data)} bytes to {shown}")
