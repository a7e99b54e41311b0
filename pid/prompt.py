"""The system prompt: a short default that names the active tools, then the workspace's context file."""
from __future__ import annotations

import posixpath
from datetime import date

from pid.messages import ToolSpec
from pid.sandbox import Sandbox

CONTEXT_FILES = ("AGENTS.md", "CLAUDE.md")
MAX_CONTEXT_FILE_BYTES = 64 * 1024

TOOL_HINTS = {
    "read": "read: read a file (text or image); use offset/limit for large files",
    "bash": "bash: run a shell command in the workspace (ls, rg, find, git, tests, builds)",
    "edit": "edit: replace exact text in a file; each oldText must match once",
    "write": "write: create or overwrite a whole file",
}

GUIDELINES = """Guidelines:
- Work autonomously: nobody answers questions while you run. Finish the task, then reply with a short summary.
- Explore with bash (rg, ls, find) and read before changing files.
- Prefer edit for changes to existing files; use write for new files or complete rewrites.
- Run the project's tests or a quick check when you can, and fix what you broke.
- Be concise; show file paths clearly when you mention them."""


def build_system_prompt(tools: list[ToolSpec], sandbox: Sandbox, *, today: date | None = None) -> str:
    names = [t.name for t in tools]
    lines = ["You are an expert coding assistant working in a sandboxed workspace. You help by reading files, "
             "running commands, editing code and writing new files.", "", "Available tools:"]
    lines += [f"- {TOOL_HINTS.get(n, n + ': ' + next(t.description for t in tools if t.name == n).splitlines()[0])}"
              for n in names] or ["- (none)"]
    lines += ["", GUIDELINES]
    context = load_context_file(sandbox)
    if context:
        name, text = context
        lines += ["", "# Project Context", "", f"## {posixpath.join(sandbox.workdir, name)}", "", text.rstrip()]
    lines += ["", f"Current date: {(today or date.today()).isoformat()}",
              f"Current working directory: {sandbox.workdir}"]
    return "\n".join(lines)


def load_context_file(sandbox: Sandbox) -> tuple[str, str] | None:
    """AGENTS.md, else CLAUDE.md, at the workspace root, read inside the sandbox (never on the host)."""
    for name in CONTEXT_FILES:
        try:
            data = sandbox.read_file(posixpath.join(sandbox.workdir, name), max_bytes=MAX_CONTEXT_FILE_BYTES)
        except OSError:  # missing, a directory, unreadable, or not a regular file
            continue
        return name, data.decode("utf-8", errors="replace")
    return None
