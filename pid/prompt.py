"""The system prompt, assembled as pi assembles it: a base (pid's short default naming the active tools, or a
replacement: `--system-prompt FILE`, else the workspace's .pi/SYSTEM.md), then the workspace's APPEND_SYSTEM.md,
then its context file (AGENTS.md), then the date and working directory.

Workspace files are read inside the sandbox (never on the host: the tree is the agent's to change)."""
from __future__ import annotations

import posixpath
from datetime import date

from pid.messages import ToolSpec
from pid.sandbox_api import Sandbox

CONTEXT_FILES = ("AGENTS.md", "CLAUDE.md")
MAX_CONTEXT_FILE_BYTES = 64 * 1024
# pi reads <cwd>/.pi/SYSTEM.md (its fallback, ~/.pi/agent/, has no place in a sandbox); pid also takes one at the root.
SYSTEM_FILES = (".pi/SYSTEM.md", "SYSTEM.md")
APPEND_SYSTEM_FILES = (".pi/APPEND_SYSTEM.md", "APPEND_SYSTEM.md")
MAX_SYSTEM_PROMPT_BYTES = 64 * 1024   # a --system-prompt file, and the workspace's SYSTEM.md / APPEND_SYSTEM.md

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


def build_system_prompt(tools: list[ToolSpec], sandbox: Sandbox, *, today: date | None = None,
                        custom: str | None = None) -> str:
    """`custom` (a --system-prompt file's text) replaces the base and wins over the workspace's SYSTEM.md."""
    # one look for every file below (a workspace with none, the usual case, costs one command, not one per name)
    present: set[str] | None
    try:
        present = sandbox.readable_files((SYSTEM_FILES if custom is None else ()) + APPEND_SYSTEM_FILES + CONTEXT_FILES)
    except OSError:   # (the look failed or timed out: each file is tried on its own, as a missing one is skipped)
        present = None
    if custom is None:
        found = load_workspace_file(sandbox, SYSTEM_FILES, MAX_SYSTEM_PROMPT_BYTES, present)
        custom = found[1] if found else None
    lines = [custom.rstrip()] if custom and custom.strip() else default_prompt(tools)   # empty: pi's default too
    append = load_workspace_file(sandbox, APPEND_SYSTEM_FILES, MAX_SYSTEM_PROMPT_BYTES, present)
    if append and append[1].strip():
        lines += ["", append[1].rstrip()]
    context = load_context_file(sandbox, present)
    if context:
        name, text = context
        lines += ["", "# Project Context", "", f"## {posixpath.join(sandbox.workdir, name)}", "", text.rstrip()]
    lines += ["", f"Current date: {(today or date.today()).isoformat()}",
              f"Current working directory: {sandbox.workdir}"]
    return "\n".join(lines)


def default_prompt(tools: list[ToolSpec]) -> list[str]:
    names = [t.name for t in tools]
    lines = ["You are an expert coding assistant working in a sandboxed workspace. You help by reading files, "
             "running commands, editing code and writing new files.", "", "Available tools:"]
    lines += [f"- {TOOL_HINTS.get(n, n + ': ' + next(t.description for t in tools if t.name == n).splitlines()[0])}"
              for n in names] or ["- (none)"]
    return lines + ["", GUIDELINES]


def load_context_file(sandbox: Sandbox, present: set[str] | None = None) -> tuple[str, str] | None:
    """AGENTS.md, else CLAUDE.md, at the workspace root."""
    return load_workspace_file(sandbox, CONTEXT_FILES, MAX_CONTEXT_FILE_BYTES, present)


def load_workspace_file(sandbox: Sandbox, names: tuple[str, ...], max_bytes: int,
                        present: set[str] | None = None) -> tuple[str, str] | None:
    """The first of `names` (relative to the workspace) that is a readable regular file, read inside the sandbox
    (never on the host), at most `max_bytes` of it: (name, text). `present`: those of them Sandbox.readable_files
    found (the others are not tried)."""
    for name in names:
        if present is not None and name not in present:
            continue
        try:
            data = sandbox.read_file(posixpath.join(sandbox.workdir, name), max_bytes=max_bytes)
        except OSError:  # missing, a directory, unreadable, or not a regular file
            continue
        return name, data.decode("utf-8", errors="replace")
    return None
