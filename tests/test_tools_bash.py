"""bash in a real container: real shells, real processes, real output (the Docker tier). Its logic alone, without
a shell, is tested against the in-memory sandbox in test_tools_bash_logic.py."""
from __future__ import annotations

import threading
import time

import pytest

from pid.messages import TextContent
from pid.tools import ToolSettings
from pid.tools.registry import MAX_ARGUMENT_BYTES
from pid.sandbox import DockerSandbox, SandboxConfig
from pid.sandbox.config import AGENT_HOME
from tests.conftest import RUNTIME
from tests.tool_sandbox import call_tool


@pytest.fixture(scope="module")
def sandbox(docker_sandbox):  # a container only (marks each test `docker`)
    return docker_sandbox


def text(result) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def bash(box, command, **args):
    ctx_fields = {k: args.pop(k) for k in ("settings", "cancel", "on_update") if k in args}
    return call_tool(box, "bash", {"command": command, **args}, **ctx_fields)


def full_output_path(result) -> str:
    return result.details["fullOutputPath"]


def test_plain_output(sandbox):
    result = bash(sandbox, "echo hello; echo err >&2")
    assert not result.is_error and text(result) == "hello\nerr\n"  # the final newline is kept, as pi keeps it
    assert result.details is None


def test_runs_in_workdir(sandbox):
    assert text(bash(sandbox, "pwd")) == sandbox.workdir + "\n"


def test_no_output(sandbox):
    result = bash(sandbox, "true")
    assert not result.is_error and text(result) == "(no output)"


def test_exit_code(sandbox):
    result = bash(sandbox, "echo oops; exit 3")
    assert result.is_error and text(result) == "oops\n\n\nCommand exited with code 3"
    assert text(bash(sandbox, "exit 2")) == "(no output)\n\nCommand exited with code 2"


def test_timeout(sandbox):
    result = bash(sandbox, "echo started; sleep 30", timeout=1)
    assert result.is_error and result.timed_out
    assert text(result) == "started\n\n\nCommand timed out after 1 seconds"
    quiet = bash(sandbox, "sleep 30", timeout="0.5")
    assert text(quiet) == "Command timed out after 0.5 seconds" and quiet.timed_out


def test_a_command_near_the_argument_bound_still_ends_at_its_timeout(sandbox):
    """Issue 21, finding 6: the timeout covers sending the command into the container. A command just under the
    argument bound, with a timeout shorter than its upload, failed with a channel error while the server went on to
    start it later, out of reach; it is a timeout like any other now, and nothing of it is left running."""
    command = "sleep 77 #" + "x" * (MAX_ARGUMENT_BYTES - 100)
    result = bash(sandbox, command, timeout=0.01)
    assert result.timed_out and text(result) == "Command timed out after 0.01 seconds"
    assert text(bash(sandbox, "ps -eo args | grep -c '^[s]leep 77'; true")) == "0\n"


def test_default_timeout_comes_from_settings(sandbox):
    result = bash(sandbox, "sleep 30", settings=ToolSettings(bash_timeout_s=1))
    assert result.timed_out and text(result) == "Command timed out after 1 seconds"


def test_context_with_lower_maximum_rejects_timeout(sandbox):
    result = bash(sandbox, "true", timeout=100, settings=ToolSettings(bash_max_timeout_s=60))
    assert result.is_error and text(result).startswith(
        'Validation failed for tool "bash":\n  - timeout: must be <= 60\n')


def test_cancel(sandbox):
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    result = bash(sandbox, "echo begun; sleep 30", cancel=cancel)
    assert result.is_error and not result.timed_out
    assert text(result) == "begun\n\n\nCommand aborted"


def test_ansi_and_control_characters_stripped(sandbox):
    result = bash(sandbox, r"printf '\033[1;31mred\033[0m plain\r\n\ttab\007bell\033]0;title\007 done\n'")
    assert text(result) == "red plain\n\ttabbell done\n"


def test_tail_line_cap(sandbox):
    result = bash(sandbox, "seq 1 3000")
    path = full_output_path(result)
    assert text(result) == ("\n".join(str(i) for i in range(1001, 3001))
                            + f"\n\n\n[Showing lines 1001-3000 of 3000. Full output: {path}]")
    assert sandbox.read_file(path) == "".join(f"{i}\n" for i in range(1, 3001)).encode()
    assert result.details["truncation"]["truncated"] is True
    assert result.details["truncation"]["truncatedBy"] == "lines"


def test_tail_byte_cap(sandbox):
    result = bash(sandbox, "for i in $(seq 1 1000); do printf '%0200d\\n' $i; done")
    # 254 lines = 254*200 + 253 = 51053 bytes; 255 would be 51254.
    assert text(result) == ("\n".join(f"{i:0200d}" for i in range(747, 1001))
                            + f"\n\n\n[Showing lines 747-1000 of 1000 (50.0KB limit). Full output: "
                              f"{full_output_path(result)}]")
    assert result.details["truncation"]["truncatedBy"] == "bytes"


def test_totals_count_the_whole_output_not_the_tail(sandbox):
    result = bash(sandbox, "seq 1 1000000")
    assert text(result) == ("\n".join(str(i) for i in range(998001, 1000001))
                            + f"\n\n\n[Showing lines 998001-1000000 of 1000000. Full output: "
                              f"{full_output_path(result)}]")
    assert result.details["truncation"]["totalBytes"] == 6888896


def test_last_line_over_the_cap(sandbox):
    result = bash(sandbox, "echo first; head -c 100000 /dev/zero | tr '\\0' a")
    assert text(result) == ("a" * 51200 + f"\n\n[Showing last 50.0KB of line 2 (line is 97.7KB). Full output: "
                            f"{full_output_path(result)}]")
    assert result.details["truncation"]["lastLinePartial"] is True


def test_last_line_longer_than_the_tail_buffer(sandbox):
    result = bash(sandbox, "seq 1 5; head -c 300000 /dev/zero | tr '\\0' b; echo")
    assert text(result) == ("b" * 51200 + f"\n\n\n[Showing last 50.0KB of line 6 (line is 293.0KB). Full output: "
                            f"{full_output_path(result)}]")


def test_last_line_cut_on_utf8_boundary(sandbox):
    result = bash(sandbox, "python3 -c \"print('x'); print('€' * 30000, end='')\"")
    shown, notice = text(result).split("\n\n")
    assert shown == "€" * 17066  # 51198 bytes: one more character would exceed 51200
    assert notice == f"[Showing last 50.0KB of line 2 (line is 87.9KB). Full output: {full_output_path(result)}]"


def test_invalid_utf8_is_replaced(sandbox):
    assert text(bash(sandbox, r"printf 'ok \377 end\n'")) == "ok \ufffd end\n"


def test_partial_output_reaches_on_update(sandbox):
    updates: list[str] = []
    # long enough that the sandbox's progress poll (every 0.75 s) sees "one" while the command still runs
    result = bash(sandbox, "printf '\\033[32mone\\033[0m\\n'; sleep 1.6; echo two", on_update=updates.append)
    assert text(result) == "one\ntwo\n"
    seen = "".join(updates)
    assert "one" in seen and "\x1b" not in seen


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_gigantic_output_keeps_the_worker_memory_bounded(sandbox):
    bash(sandbox, "echo warm")  # channel and buffers set up before measuring
    before = _rss_kib()
    result = bash(sandbox, "head -c 200000000 /dev/zero | tr '\\0' x", timeout=120)
    grown_kib = _rss_kib() - before
    assert grown_kib < 10 * 1024, f"grew {grown_kib} KiB"
    shown, notice = text(result).split("\n\n")
    assert shown == "x" * 51200
    # (a slow run may have had the kept file's front cut while it ran: the notice then says from which byte)
    assert notice.startswith("[Showing last 50.0KB of line 1 (line is 190.7MB). ")
    assert "Full output: /.pid/out/" in notice or "what is before it reads as NUL bytes): /.pid/out/" in notice


def test_final_newlines_are_kept(sandbox):
    assert text(bash(sandbox, "printf 'a\\n\\n'")) == "a\n\n"
    assert text(bash(sandbox, "printf 'no newline'")) == "no newline"


def test_output_of_background_children_just_after_exit_is_kept(sandbox):
    # (written 50 ms after the command's end, inside the 100 ms of quiet pid waits for, as pi does: a child that
    # writes at 100 ms exactly is at the window's edge, and on a loaded CI host fell either side of it)
    result = bash(sandbox, "(sleep 0.05; echo late) & echo early")
    assert text(result) == "early\nlate\n"
    result = bash(sandbox, "(for i in 1 2 3; do sleep 0.05; echo tick$i; done) & echo go")
    assert text(result) == "go\ntick1\ntick2\ntick3\n"


def test_waiting_for_background_output_is_bounded(sandbox):
    started = time.monotonic()
    quiet = bash(sandbox, "sleep 30 & echo quiet")   # holds the output open, writes nothing
    assert text(quiet) == "quiet\n"
    # ~3 s of output, already flowing when the command ends (a loaded CI host once took over 100 ms to start the
    # loop's `seq`, and the call rightly ended before its first line)
    chatty = bash(sandbox, "(for i in $(seq 150); do echo x; sleep 0.02; done) & sleep 0.3; echo chatty")
    assert "chatty\nx\n" in text(chatty)   # what it wrote after the command's end was kept
    assert time.monotonic() - started < 6
    bash(sandbox, "pkill -u \"$(id -u)\" -x sleep; true")   # the agent's leftovers only


@pytest.mark.docker
def test_missing_working_directory():
    """pi refuses to run a command without its working directory (the file tools still work by absolute path)."""
    box = DockerSandbox.create(SandboxConfig(job_id="test-tools-nowd", workdir="/tmp/pid-wd", disk=0,
                                             runtime=RUNTIME))
    try:
        assert text(bash(box, "pwd")) == "/tmp/pid-wd\n"
        box.write_file("/tmp/kept.txt", b"kept\n")
        bash(box, "cd / && rm -rf /tmp/pid-wd")
        result = bash(box, "touch /tmp/ran")
        assert result.is_error and text(result) == (
            "Working directory does not exist: /tmp/pid-wd\nCannot execute bash commands.")
        assert text(call_tool(box, "read", {"path": "/tmp/kept.txt"})) == "kept\n"
        assert text(call_tool(box, "read", {"path": "/tmp/ran"})) == "File not found: /tmp/ran"
        # pid's own helper commands still run: ~ is expanded, a symlinked name is locked by its real path
        box.write_file(f"{AGENT_HOME}/h.txt", b"home\n")
        assert text(call_tool(box, "read", {"path": "~/h.txt"})) == "home\n"
        assert not call_tool(box, "write", {"path": "~/w.txt", "content": "w"}).is_error
    finally:
        box.close()


def test_a_call_cancelled_at_once_leaves_later_calls_intact(sandbox):
    """A command killed before its shell read it must not be run by (or garble) the next call on that channel."""
    cancel = threading.Event()
    cancel.set()
    for i in range(6):
        assert text(bash(sandbox, f"echo stale{i}", cancel=cancel)).endswith("Command aborted")
        for j in range(3):
            assert text(bash(sandbox, f"echo fresh{i}{j}")) == f"fresh{i}{j}\n"


def test_one_line_over_the_cap_without_a_final_newline_is_kept_too(sandbox):
    result = bash(sandbox, "seq 1 2000; printf last")   # 2000 newlines, 2001 lines: line 1 is not shown
    path = full_output_path(result)
    assert text(result).endswith(f"\nlast\n\n[Showing lines 2-2001 of 2001. Full output: {path}]")
    assert sandbox.read_file(path).startswith(b"1\n2\n")
