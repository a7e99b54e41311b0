"""write through the registry, against the in-memory sandbox and a real container (see tests/tool_sandbox.py)."""
from __future__ import annotations

import itertools
import os

from pid.messages import TextContent
from pid.sandbox import fileops
from pid.sandbox.config import AGENT_HOME
from tests.memory_sandbox import MemorySandbox
from tests.tool_sandbox import call_tool, get


def text(result) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def test_write_counts_utf8_bytes_and_creates_parents(sandbox):
    result = call_tool(sandbox, "write", {"path": "deep/er/f.txt", "content": "héllo €\n"})
    assert not result.is_error
    assert text(result) == "Successfully wrote 11 bytes to deep/er/f.txt"
    assert get(sandbox, "deep/er/f.txt") == "héllo €\n".encode()


def test_write_overwrites(sandbox):
    call_tool(sandbox, "write", {"path": "@o.txt", "content": "a much longer first version\n"})
    result = call_tool(sandbox, "write", {"path": "o.txt", "content": ""})
    assert text(result) == "Successfully wrote 0 bytes to o.txt"
    assert get(sandbox, "o.txt") == b""


def test_write_absolute_path_and_then_edit(sandbox):
    path = f"{sandbox.workdir}/abs.txt"
    result = call_tool(sandbox, "write", {"path": path, "content": "x\n"})
    assert text(result) == f"Successfully wrote 2 bytes to {path}"
    assert not call_tool(sandbox, "edit", {"path": "abs.txt", "edits": [{"oldText": "x", "newText": "y"}]}).is_error
    assert get(sandbox, "abs.txt") == b"y\n"


def test_write_missing_content_is_a_validation_error(sandbox):
    result = call_tool(sandbox, "write", {"path": "f"})
    assert result.is_error and text(result) == (
        'Validation failed for tool "write":\n  - content: must have required property \'content\'\n\n'
        'Received arguments:\n{\n  "path": "f"\n}')


def make_fifo_and_file(box, fifo: str, plain: str) -> None:
    if isinstance(box, MemorySandbox):
        box.special.add(f"{box.workdir}/{fifo}")
        box.write_file(plain, b"x")
    else:
        box.exec(f"rm -f {fifo}; mkfifo {fifo}; printf x > {plain}", timeout=10)


def test_the_tools_name_a_fifo_or_a_file_parent_plainly(sandbox):
    make_fifo_and_file(sandbox, "fifo-x", "plain-x")
    read = call_tool(sandbox, "read", {"path": "fifo-x"})
    edit = call_tool(sandbox, "edit", {"path": "fifo-x", "edits": [{"oldText": "a", "newText": "b"}]})
    write = call_tool(sandbox, "write", {"path": "fifo-x", "content": "y"})
    under_file = call_tool(sandbox, "write", {"path": "plain-x/child.txt", "content": "y"})
    expected = "fifo-x is not a regular file (a FIFO, socket or device). Use bash to work with it."
    assert [r.content[0].text for r in (read, edit, write)] == [expected] * 3
    assert all(r.is_error for r in (read, edit, write, under_file))
    assert under_file.content[0].text == "A parent of plain-x/child.txt is a file, not a directory."


def test_paths_follow_pi_rules(docker_sandbox):  # needs a real shell
    sandbox = docker_sandbox
    """`~` is the agent's home, a file:// URL names its path, Unicode spaces are plain spaces."""
    result = call_tool(sandbox, "write", {"path": "~/notes/home.txt", "content": "h"})
    assert text(result) == "Successfully wrote 1 bytes to ~/notes/home.txt"
    assert sandbox.read_file(f"{AGENT_HOME}/notes/home.txt") == b"h"
    call_tool(sandbox, "write", {"path": f"file://{sandbox.workdir}/url%20name.txt", "content": "u"})
    assert get(sandbox, "url name.txt") == b"u"
    call_tool(sandbox, "write", {"path": "no\u00a0break\u202fspaces.txt", "content": "s"})
    assert get(sandbox, "no break spaces.txt") == b"s"
    remote = call_tool(sandbox, "write", {"path": "file://example.com/x", "content": "r"})
    assert remote.is_error and text(remote) == 'File URL host must be "localhost" or empty on linux'


def test_a_write_inlined_in_its_command_runs_on_a_server_without_slot_shells(docker_sandbox, monkeypatch):
    """A bash server whose slot FIFOs could not be made (here a directory stands in the first one's place; in life, no
    inode left) starts each command as `bash -c <command>`: one argument of an exec, at most 128 KiB on Linux. A write
    whose data rides in its command must fit it: the longest that did not failed with E2BIG."""
    box = docker_sandbox
    channel_id = 9000 + os.getpid() % 1000
    blocker = f"/.pid/run/cmd.{channel_id}.0"
    engine = box.container.client.containers.get(box.container.id)
    assert engine.exec_run(["mkdir", blocker], user="root").exit_code == 0
    monkeypatch.setattr(box.channels, "_ids", itertools.count(channel_id))
    channel = box.channels._open_channel("agent")
    try:
        assert channel.shell == "bash" and not channel.hands_over()
        assert engine.exec_run(["test", "-d", blocker], user="root").exit_code == 0   # so the server has no slots
        monkeypatch.setattr(box.channels, "acquire", lambda: channel)
        monkeypatch.setattr(box.channels, "release", lambda _: None)
        monkeypatch.setattr(box.channels, "discard", lambda _: None)
        path = f"{box.workdir}/inline-big.txt"
        empty = len(fileops.inline_write_snippet(path, b"", 1 << 20) or b"")
        for command in (fileops.INLINE_MAX, 1 << 17):   # the longest inlined now, and the longest inlined before
            content = "".join(chr(ord("a") + i % 26) for i in range(command - empty))
            inlined = fileops.inline_write_snippet(path, content.encode(), fileops.INLINE_MAX)
            assert (inlined is not None) == (command == fileops.INLINE_MAX)
            result = call_tool(box, "write", {"path": "inline-big.txt", "content": content})
            assert not result.is_error and get(box, "inline-big.txt") == content.encode(), (command, text(result))
        assert not channel.broken
    finally:
        channel.close()
        engine.exec_run(["rmdir", blocker], user="root")
