"""The system prompt as pi assembles it: a base (pid's default, or a --system-prompt file's text, else the
workspace's .pi/SYSTEM.md or SYSTEM.md), the workspace's APPEND_SYSTEM.md, its AGENTS.md, the date and directory.
Workspace files are read through the sandbox (the in-memory one here: nothing on the host is read)."""
from __future__ import annotations

from datetime import date

from pid.prompt import MAX_SYSTEM_PROMPT_BYTES, build_system_prompt
from pid.tools.registry import default_registry
from tests.memory_sandbox import MemorySandbox

TODAY = date(2026, 1, 2)
TAIL = "\n\nCurrent date: 2026-01-02\nCurrent working directory: /workspace"


def prompt(files: dict[str, str], custom: str | None = None) -> str:
    return build_system_prompt(default_registry().specs(), MemorySandbox(files=files), today=TODAY, custom=custom)


def test_the_default_names_the_tools_and_ends_with_the_context_file_date_and_directory():
    text = prompt({"AGENTS.md": "be kind\n"})
    assert text.startswith("You are an expert coding assistant")
    assert "- bash: run a shell command" in text
    assert text.endswith("\n\n# Project Context\n\n## /workspace/AGENTS.md\n\nbe kind" + TAIL)


def test_pi_dir_system_md_replaces_the_default_and_append_system_md_follows_it_before_the_context():
    text = prompt({".pi/SYSTEM.md": "You are SYS-A.\n", "SYSTEM.md": "root one", "AGENTS.md": "ctx",
                   ".pi/APPEND_SYSTEM.md": "Also APP-B.\n"})
    assert text == ("You are SYS-A.\n\nAlso APP-B.\n\n# Project Context\n\n## /workspace/AGENTS.md\n\nctx" + TAIL)


def test_a_root_system_md_and_append_system_md_count_when_there_is_no_pi_dir():
    assert prompt({"SYSTEM.md": "ROOT-SYS", "APPEND_SYSTEM.md": "ROOT-APP"}) == "ROOT-SYS\n\nROOT-APP" + TAIL


def test_append_system_md_alone_appends_to_the_default():
    text = prompt({".pi/APPEND_SYSTEM.md": "APP-ONLY"})
    assert text.startswith("You are an expert coding assistant") and text.endswith("\n\nAPP-ONLY" + TAIL)


def test_the_command_lines_prompt_wins_over_the_workspaces_system_md_but_the_append_still_follows():
    text = prompt({".pi/SYSTEM.md": "REPO-SYS", ".pi/APPEND_SYSTEM.md": "APP"}, custom="CLI-SYS\n")
    assert text == "CLI-SYS\n\nAPP" + TAIL


def test_an_empty_system_md_leaves_the_default_and_a_large_one_is_read_up_to_the_limit():
    assert prompt({".pi/SYSTEM.md": " \n"}).startswith("You are an expert coding assistant")
    big = "x" * (MAX_SYSTEM_PROMPT_BYTES + 100)
    assert prompt({".pi/SYSTEM.md": big}) == "x" * MAX_SYSTEM_PROMPT_BYTES + TAIL


def test_a_system_md_that_is_a_directory_is_skipped():
    box = MemorySandbox(files={"SYSTEM.md": "ROOT"})
    box.dirs.add("/workspace/.pi/SYSTEM.md")
    assert build_system_prompt(default_registry().specs(), box, today=TODAY).startswith("ROOT\n")


def test_the_workspace_is_looked_at_once_and_only_the_files_found_are_read():
    box = MemorySandbox(files={"AGENTS.md": "ctx", "CLAUDE.md": "not this one"})
    reads: list[str] = []
    read = box.read_file
    box.read_file = lambda path, **kw: reads.append(path) or read(path, **kw)   # type: ignore[method-assign]
    text = build_system_prompt(default_registry().specs(), box, today=TODAY)
    assert box.looks == [[".pi/SYSTEM.md", "SYSTEM.md", ".pi/APPEND_SYSTEM.md", "APPEND_SYSTEM.md", "AGENTS.md",
                          "CLAUDE.md"]]
    assert reads == ["/workspace/AGENTS.md"] and text.endswith("ctx" + TAIL)
    box.looks.clear()
    build_system_prompt(default_registry().specs(), box, today=TODAY, custom="MINE")
    assert box.looks == [[".pi/APPEND_SYSTEM.md", "APPEND_SYSTEM.md", "AGENTS.md", "CLAUDE.md"]]


def test_a_failed_look_leaves_each_file_to_its_own_read():
    box = MemorySandbox(files={"AGENTS.md": "ctx"})

    def fails(paths, **kw):
        raise TimeoutError("no answer")
    box.readable_files = fails   # type: ignore[method-assign]
    assert build_system_prompt(default_registry().specs(), box, today=TODAY).endswith("ctx" + TAIL)
