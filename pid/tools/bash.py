"""bash: run a command in the sandbox and show the model the last 2000 lines / 50KB of its output.

The sandbox keeps only a bounded tail plus totals (and the full output in a file), so a command printing gigabytes
costs nothing here; the notices' line numbers count the whole output, not the tail.
"""
from __future__ import annotations

import codecs
import shlex
from typing import Any, Callable

from pid.messages import ImageContent, TextContent
from pid.sandbox_api import ExecResult, OutputPolicy, RUN_ANYWHERE
from pid.terminal import strip_escapes
from pid.tools.base import Tool, ToolContext, ToolResult, ToolSettings
from pid.tools.schema import format_validation_error
from pid.tools.truncate import MAX_BYTES, MAX_LINES, format_size, split_lines, truncate_tail

# Comfortably more than MAX_BYTES so cuts land on line boundaries even after escape sequences are stripped.
TAIL_BYTES = 128 * 1024
# Whatever the model is shown less of than the whole stays reachable in the kept output file.
OUTPUT = OutputPolicy(tail_bytes=TAIL_BYTES, keep_lines=MAX_LINES, keep_bytes=MAX_BYTES)

DISK_FULL_NOTICE = ("No space left on device, or nearly: the job's disk has less than 1 MiB left (its --disk limit). "
                    "Writes fail, or soon will, until files are removed.")
OUT_OF_MEMORY_NOTICE = ("The container ran out of memory (its memory limit): the kernel killed processes to free "
                        "memory (a process killed so exits with code 137). Files in /dev/shm count against the limit "
                        "too.")
OUTPUT_LOST_NOTICE = ("The command's output filled the room pid keeps for it (about 1 GiB, printed faster than pid "
                      "trims it): the rest was lost, and its writes to its output failed (which may be why it "
                      "failed). Send such output to a file, or print less.")
PIDS_LIMIT_NOTICE = ("The container's process limit was reached: some processes could not start. All of the agent's "
                     "processes (background ones too) were killed so that the next command can run.")


# The sandbox runs no command without its working directory; it answers with this status and pi's message instead.
NO_WORKDIR_STATUS = 212


def no_workdir_message(workdir: str) -> str:
    return f"Working directory does not exist: {workdir}\nCannot execute bash commands."


def _fmt_seconds(t: float) -> str:
    return f"{t:g}"


def _clean_number(x: float) -> int | float:
    """600.0 -> 600, so the schema the model sees reads naturally."""
    return int(x) if float(x).is_integer() else x


def bash_tool(settings: ToolSettings | None = None) -> Tool:
    settings = settings or ToolSettings()
    description = (
        f"Execute a bash command in the working directory. Returns stdout and stderr merged. Output is truncated "
        f"to the last {MAX_LINES} lines or {MAX_BYTES // 1024}KB, whichever is hit first; when truncated, the "
        f"full output is saved to a file you can read. Timeout defaults to {_fmt_seconds(settings.bash_timeout_s)} "
        f"seconds (maximum {_fmt_seconds(settings.bash_max_timeout_s)}). Commands run non-interactively: stdin "
        f"is empty.")
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "Bash command to execute"},
            "timeout": {"type": "number", "exclusiveMinimum": 0,
                        "maximum": _clean_number(settings.bash_max_timeout_s),
                        "description": f"Timeout in seconds (default {_fmt_seconds(settings.bash_timeout_s)})"},
        },
        "required": ["command"],
    }
    return Tool("bash", description, parameters, run_bash)


def run_bash(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    timeout = args.get("timeout")
    if timeout is not None and timeout > ctx.settings.bash_max_timeout_s:
        # The schema carries the registry's maximum; a context with a lower one is enforced here, same wording.
        return ToolResult.error(format_validation_error(
            "bash", [("timeout", f"must be <= {_fmt_seconds(ctx.settings.bash_max_timeout_s)}")], args))
    timeout = timeout or ctx.settings.bash_timeout_s
    result = ctx.sandbox.exec(args["command"], timeout=timeout, output=OUTPUT, cancel=ctx.cancel,
                              on_output=_forwarder(ctx.on_update) if ctx.on_update else None)
    if result.exit_code == NO_WORKDIR_STATUS and result.tail == no_workdir_message(ctx.sandbox.workdir).encode():
        return ToolResult.error(no_workdir_message(ctx.sandbox.workdir))
    text, details = format_output(ctx, result)
    if result.pids_limit_hit:
        text = _append(text, PIDS_LIMIT_NOTICE)
    if result.disk_full:
        text = _append(text, DISK_FULL_NOTICE)
    if result.out_of_memory:
        text = _append(text, OUT_OF_MEMORY_NOTICE)
    if result.output_lost:
        text = _append(text, OUTPUT_LOST_NOTICE)

    if result.cancelled:
        return ToolResult(_text(_append(text, "Command aborted")), True, details)
    if result.timed_out:
        return ToolResult(_text(_append(text, f"Command timed out after {_fmt_seconds(timeout)} seconds")),
                          True, details, timed_out=True)
    if result.exit_code is None:
        return ToolResult(_text(_append(text, "Command was killed before it exited")), True, details)
    if result.exit_code != 0:
        return ToolResult(_text(_append(text or "(no output)", f"Command exited with code {result.exit_code}")),
                          True, details)
    return ToolResult(_text(text or "(no output)"), False, details)


def _text(s: str) -> list[TextContent | ImageContent]:
    return [TextContent(s)]


def _append(text: str, status: str) -> str:
    return f"{text}\n\n{status}" if text else status


def _forwarder(on_update: Callable[[str], None]) -> Callable[[bytes], None]:
    """Decode chunks incrementally (a character may straddle two chunks) and pass on the sanitised text."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def forward(chunk: bytes) -> None:
        text = strip_escapes(decoder.decode(chunk))
        if text:
            on_update(text)

    return forward


def format_output(ctx: ToolContext, result: ExecResult) -> tuple[str, dict[str, Any] | None]:
    """The tail the model sees plus a notice when anything was cut; empty string for no output."""
    raw = result.tail
    complete = len(raw) >= result.total_bytes  # the buffer holds the whole output
    ends_with_newline = raw.endswith(b"\n")
    starts_at_line = complete
    if not complete:
        # The buffer starts mid-line: that first fragment can never be shown whole, so drop it, unless it is all
        # there is (one enormous last line), which truncate_tail then shows the end of.
        newline = raw.find(b"\n")
        if 0 <= newline < len(raw) - 1:
            raw = raw[newline + 1:]
            starts_at_line = True
    text = strip_escapes(raw.decode("utf-8", "replace"))
    # The output's final newline is kept, as pi keeps it; it ends the last line and is never an extra (empty) one.
    final_newline = "\n" if text.endswith("\n") else ""
    cut = truncate_tail(split_lines(text))
    content = cut.content + final_newline

    shown_all = complete and cut.truncated_by is None
    if shown_all:
        return content, None

    total = result.total_lines
    end = total
    start = max(total - cut.output_lines + 1, 1)
    if result.output_path:
        ctx.full_outputs.add(result.output_path)
    if result.output_path and result.output_from:
        where = (f". The last {format_size(result.total_bytes - result.output_from)} of the output (from byte "
                 f"{result.output_from}; what is before it reads as NUL bytes): {result.output_path}]")
    else:
        where = f". Full output: {result.output_path}]" if result.output_path else ".]"
    truncated_by = cut.truncated_by or ("bytes" if result.total_bytes > MAX_BYTES else "lines")
    details: dict[str, Any] = {"truncation": {"truncated": True, "truncatedBy": truncated_by, "totalLines": total,
                                              "totalBytes": result.total_bytes, "outputLines": cut.output_lines,
                                              "outputBytes": cut.output_bytes,
                                              "lastLinePartial": cut.last_line_partial,
                                              "firstLineExceedsLimit": False, "maxLines": MAX_LINES,
                                              "maxBytes": MAX_BYTES},
                               "fullOutputPath": result.output_path}
    if cut.last_line_partial:
        line_size = _last_line_size(ctx, result, raw, starts_at_line, ends_with_newline)
        size_text = format_size(line_size) if line_size is not None else f"over {format_size(len(raw))}"
        notice = f"[Showing last {format_size(cut.output_bytes)} of line {end} (line is {size_text}){where}"
    elif cut.output_lines >= MAX_LINES and cut.truncated_by != "bytes":
        notice = f"[Showing lines {start}-{end} of {total}{where}"
    else:
        notice = f"[Showing lines {start}-{end} of {total} ({format_size(MAX_BYTES)} limit){where}"
    return f"{content}\n\n{notice}", details


def _last_line_size(ctx: ToolContext, result: ExecResult, raw: bytes, starts_at_line: bool,
                    ends_with_newline: bool) -> int | None:
    """Raw byte size of the output's last line, asking the sandbox when it began before the buffer."""
    body = raw[:-1] if ends_with_newline else raw
    if starts_at_line or b"\n" in body:
        return len(body.rsplit(b"\n", 1)[-1])
    if result.total_lines == 1:
        return result.total_bytes - (1 if ends_with_newline else 0)
    if not result.output_path:
        return None
    probe = ctx.sandbox.exec(f"{RUN_ANYWHERE}tail -n 1 {shlex.quote(result.output_path)} | tr -d '\\n' | wc -c",
                             timeout=60, output=OutputPolicy(tail_bytes=64))
    try:
        return int(probe.tail.strip()) if probe.exit_code == 0 else None
    except ValueError:
        return None
