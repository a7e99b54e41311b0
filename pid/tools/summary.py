"""A tool call in a few words, for people watching a job (`pid run`'s lines, `pid status`). One rule for every view,
and safe for a terminal: the model chose these strings, so they pass through pid.terminal.one_line."""
from __future__ import annotations

import json
from typing import Any

from pid.terminal import one_line


def summarize_call(name: str, args: dict[str, Any], width: int = 100) -> str:
    if name == "bash":
        lines = str(args.get("command", "")).strip().splitlines()
        summary = (lines[0] + (" …" if len(lines) > 1 else "")) if lines else ""
    elif name == "write":
        summary = f"{args.get('path', '')} ({len(str(args.get('content', '')).encode())} bytes)"
    elif name == "read":
        extra = f" @{args['offset']}" if args.get("offset") else ""
        summary = f"{args.get('path', '')}{extra}"
    else:
        summary = str(args.get("path", "")) or json.dumps(args)[:width]
    summary = one_line(summary)
    return summary if len(summary) <= width else summary[:width - 1] + "…"
