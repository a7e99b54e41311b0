"""Tools by name: what the model is told (specs) and one `execute` that turns any call into a ToolResult.

`execute` never raises: an unknown tool, unparseable or invalid arguments and handler exceptions all become error
results the model can read and correct, so the loop has a single path for every tool call.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

from pid.messages import ToolCall, ToolSpec
from pid.sandbox_api import SandboxLost
from pid.tools import bash, edit, read, write
from pid.tools.base import Tool, ToolContext, ToolResult, ToolSettings
from pid.tools.schema import NOT_RUN, format_validation_error, validate
from pid.tools.truncate import utf8_len

RAW_ARGUMENTS_QUOTE_CHARS = 2000
# The most one argument of a tool call may hold, in UTF-8 bytes: a `write` of a large file (~1 MB) fits, and nothing
# larger is ever uploaded into the container or held on its way there. (A whole reply is bounded too:
# pid/providers/transport.py's MAX_REPLY_BYTES.)
MAX_ARGUMENT_BYTES = 2 << 20


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    def register(self, tool: Tool) -> Tool:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def subset(self, names: Iterable[str]) -> "ToolRegistry":
        names = list(names)
        unknown = [n for n in names if n not in self._tools]
        if unknown:
            raise ValueError(f"unknown tool(s) {', '.join(unknown)}; known tools: {', '.join(self._tools)}")
        return ToolRegistry(self._tools[n] for n in names)

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def execute(self, call: ToolCall, ctx: ToolContext) -> ToolResult:
        tool = self._tools.get(call.name)
        if tool is None:
            return ToolResult.error(f"Tool {call.name} not found")
        if call.raw_arguments is not None:
            return ToolResult.error(_invalid_json_message(call.name, call.raw_arguments))
        received = call.arguments
        oversized = _oversized(received)
        if oversized is not None:
            return ToolResult.error(_oversized_message(call.name, *oversized))
        try:
            args = tool.prepare(dict(received)) if tool.prepare and isinstance(received, dict) else received
            args, errors = validate(tool.parameters, args)
            if errors:
                return ToolResult.error(format_validation_error(tool.name, errors, received))
            result = tool.handler(ctx, args)
        except SandboxLost:
            raise   # not the model's to handle: the loop ends the job
        except Exception as e:  # noqa: BLE001 - every failure goes back to the model as text
            return ToolResult.error(str(e) or type(e).__name__)
        if isinstance(result, str):
            return ToolResult.text(result)
        return result


def _oversized(arguments: Any) -> tuple[str, int] | None:
    """(where, UTF-8 bytes) of the first string in the arguments larger than MAX_ARGUMENT_BYTES, if any. (Walked
    without recursion: the model chooses how deeply its arguments nest.)"""
    stack: list[tuple[str, Any]] = [("", arguments)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            # (a character is 1 to 4 bytes: only a string that may be over the bound is encoded to find out)
            size = utf8_len(value) if 4 * len(value) > MAX_ARGUMENT_BYTES else 0
            if size > MAX_ARGUMENT_BYTES:
                return path or "root", size
        elif isinstance(value, (dict, list)):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend((f"{path}/{key}" if path else str(key), item) for key, item in items)
    return None


def _oversized_message(name: str, where: str, size: int) -> str:
    return (f'Argument "{where}" of tool "{name}" is {size} bytes, over the limit of {MAX_ARGUMENT_BYTES} bytes '
            f"({MAX_ARGUMENT_BYTES >> 20} MiB) for one argument, {NOT_RUN}. Split the work into smaller "
            f"calls (a large file: write a first part, then append the rest).")


def _invalid_json_message(name: str, raw: str) -> str:
    quoted = raw if len(raw) <= RAW_ARGUMENTS_QUOTE_CHARS else (
        raw[:RAW_ARGUMENTS_QUOTE_CHARS] + f"... [truncated, {len(raw)} characters total]")
    try:   # (valid JSON of another kind, `[1, 2]`, is no object either: said as it is)
        json.loads(raw, strict=False)
        what = "were JSON, but not one JSON object"
    except (ValueError, RecursionError):
        what = "were not valid JSON"
    return (f'The arguments for tool "{name}" {what}, {NOT_RUN}. '
            f"Send the arguments again as one valid JSON object.\n\nReceived:\n{quoted}")


def default_registry(settings: ToolSettings | None = None) -> ToolRegistry:
    """read, bash, edit and write. `settings` sets the bash timeout bounds written into its schema."""
    return ToolRegistry([read.read_tool(), bash.bash_tool(settings or ToolSettings()), edit.edit_tool(),
                         write.write_tool()])


__all__ = ["ToolRegistry", "default_registry"]
