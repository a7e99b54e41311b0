"""The bash tool's own logic, without a shell: the in-memory sandbox plays each command's output, exit, duration.

Truncation and its notices, the kept full-output file, timeouts, cancel, live updates and the sandbox's own failures,
through the registry as the loop calls it. What a real shell does with them: test_tools_bash.py (Docker tier).
"""
from __future__ import annotations

import threading
import time

import pytest

from pid.messages import TextContent, ToolCall
from pid.sandbox_api import OutputPolicy, RUN_ANYWHERE, SandboxError, SandboxLost
from pid.tools import ToolContext, ToolSettings, default_registry
from pid.tools.bash import DISK_FULL_NOTICE, OUTPUT, OUTPUT_LOST_NOTICE, PIDS_LIMIT_NOTICE, TAIL_BYTES
from pid.tools.truncate import MAX_BYTES, MAX_LINES
from tests.memory_sandbox import Commands, MemorySandbox, Run
from tests.tool_sandbox import call_tool


def text(result) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def bash(box: MemorySandbox, command: str, **args):
    ctx_fields = {k: args.pop(k) for k in ("settings", "cancel", "on_update") if k in args}
    return call_tool(box, "bash", {"command": command, **args}, **ctx_fields)


def box_with(**table: Run) -> MemorySandbox:
    """A sandbox whose commands are the keywords' names, e.g. box_with(hello=Run("hi\\n"))."""
    return MemorySandbox(Commands(table))


def seq(first: int, last: int) -> str:
    return "".join(f"{i}\n" for i in range(first, last + 1))


def test_output_exit_codes_and_the_policy_bash_asks_for():
    box = box_with(ok=Run("hello\nerr\n"), quiet=Run(), fails=Run("oops\n", exit_code=3), silent_fail=Run(exit_code=2),
                   killed=Run("half\n", exit_code=None))
    assert (text(ok := bash(box, "ok")), ok.is_error, ok.details) == ("hello\nerr\n", False, None)
    assert text(bash(box, "quiet")) == "(no output)"
    assert text(bash(box, "fails")) == "oops\n\n\nCommand exited with code 3"
    assert text(bash(box, "silent_fail")) == "(no output)\n\nCommand exited with code 2"
    killed = bash(box, "killed")
    assert killed.is_error and text(killed) == "half\n\n\nCommand was killed before it exited"
    assert bash(box, "nope").is_error   # an unscripted command is bash's 127, never a silent pass
    assert OUTPUT == OutputPolicy(tail_bytes=TAIL_BYTES, keep_lines=MAX_LINES, keep_bytes=MAX_BYTES)
    assert {call.output for call in box.calls} == {OUTPUT}
    assert {call.timeout for call in box.calls} == {ToolSettings().bash_timeout_s}


def test_timeout_reports_what_was_printed_and_comes_from_the_argument_or_the_settings():
    box = box_with(slow=Run("started\n", 30.0), quiet=Run(30.0))
    began = time.monotonic()
    result = bash(box, "slow", timeout=0.2)
    assert time.monotonic() - began < 2
    assert result.is_error and result.timed_out and text(result) == "started\n\n\nCommand timed out after 0.2 seconds"
    quiet = bash(box, "quiet", settings=ToolSettings(bash_timeout_s=0.1))
    assert quiet.timed_out and text(quiet) == "Command timed out after 0.1 seconds"
    assert [call.timeout for call in box.calls] == [0.2, 0.1]


def test_a_timeout_over_the_contexts_maximum_never_reaches_the_sandbox():
    box = box_with()
    result = bash(box, "true", timeout=100, settings=ToolSettings(bash_max_timeout_s=60))
    assert text(result).startswith('Validation failed for tool "bash":\n  - timeout: must be <= 60\n')
    assert box.commands == []


def test_cancel_ends_the_command_and_says_so():
    box = box_with(long=Run("begun\n", 30.0))
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    began = time.monotonic()
    result = bash(box, "long", cancel=cancel)
    assert time.monotonic() - began < 2
    assert result.is_error and not result.timed_out and text(result) == "begun\n\n\nCommand aborted"
    assert box.calls[0].result.cancelled


def test_line_cap_shows_the_tail_and_keeps_the_whole_output():
    box = box_with(many=Run(seq(1, 3000)))
    result = bash(box, "many")
    path = result.details["fullOutputPath"]
    assert text(result) == seq(1001, 3000) + f"\n\n[Showing lines 1001-3000 of 3000. Full output: {path}]"
    assert box.read_file(path) == seq(1, 3000).encode()   # under the tail buffer, yet kept: keep_lines
    truncation = result.details["truncation"]
    assert (truncation["truncated"], truncation["truncatedBy"], truncation["totalBytes"]) == \
        (True, "lines", len(seq(1, 3000)))


def test_one_line_over_the_cap_without_a_final_newline_is_kept_too():
    box = box_with(many=Run(seq(1, 2000) + "last"))   # 2000 newlines, 2001 lines: line 1 is not shown
    result = bash(box, "many")
    path = result.details["fullOutputPath"]
    assert text(result).endswith(f"\nlast\n\n[Showing lines 2-2001 of 2001. Full output: {path}]")
    assert box.read_file(path) == (seq(1, 2000) + "last").encode()


def test_byte_cap():
    rows = "".join(f"{i:0200d}\n" for i in range(1, 1001))
    result = bash(box_with(wide=Run(rows)), "wide")
    # 254 lines = 254*200 + 253 = 51053 bytes; 255 would be 51254.
    assert text(result) == ("\n".join(f"{i:0200d}" for i in range(747, 1001))
                            + f"\n\n\n[Showing lines 747-1000 of 1000 (50.0KB limit). Full output: "
                              f"{result.details['fullOutputPath']}]")


def test_totals_count_the_whole_output_not_the_tail():
    result = bash(box_with(huge=Run(seq(1, 100000))), "huge")
    assert text(result).endswith(f"\n\n[Showing lines 98001-100000 of 100000. Full output: "
                                 f"{result.details['fullOutputPath']}]")
    assert text(result).startswith("98001\n")
    assert result.details["truncation"]["totalBytes"] == len(seq(1, 100000))


def test_a_last_line_over_the_cap_that_starts_in_the_buffer():
    result = bash(box_with(line=Run("first\n" + "a" * 100000)), "line")
    assert text(result) == ("a" * 51200 + f"\n\n[Showing last 50.0KB of line 2 (line is 97.7KB). Full output: "
                            f"{result.details['fullOutputPath']}]")


def last_line_size(command: str, box: MemorySandbox) -> Run:
    """What `tail -n 1 FILE | tr -d '\\n' | wc -c` prints, from the sandbox's own file."""
    last = box.read_file(command.removeprefix(RUN_ANYWHERE).split()[3]).rstrip(b"\n").rsplit(b"\n", 1)[-1]
    return Run(f"{len(last)}\n")


def test_a_last_line_longer_than_the_tail_buffer_is_measured_in_the_sandbox():
    def handler(command: str, box: MemorySandbox) -> Run:
        if command.startswith(RUN_ANYWHERE + "tail -n 1 "):
            return last_line_size(command, box)
        return Run(seq(1, 5) + "b" * 300000 + "\n")
    box = MemorySandbox(handler)
    result = bash(box, "print it")
    path = result.details["fullOutputPath"]
    assert text(result) == "b" * 51200 + f"\n\n\n[Showing last 50.0KB of line 6 (line is 293.0KB). Full output: {path}]"
    probe = box.calls[1]
    assert probe.command == f"#pid:anywhere\ntail -n 1 {path} | tr -d '\\n' | wc -c"
    assert probe.output == OutputPolicy(tail_bytes=64)


def test_when_the_last_line_cannot_be_measured_its_size_is_a_lower_bound():
    box = box_with(print_it=Run(seq(1, 5) + "b" * 300000 + "\n"))   # the probe is not scripted: it fails
    notice = text(bash(box, "print_it")).split("\n\n\n")[1]
    assert notice.startswith(f"[Showing last 50.0KB of line 6 (line is over {TAIL_BYTES // 1024}.0KB). Full output: ")


def test_a_kept_output_whose_front_was_dropped_says_where_it_starts():
    box = box_with(many=Run(seq(1, 3000)))
    box.keep_output_max = 1000
    result = bash(box, "many")
    path = result.details["fullOutputPath"]
    dropped = len(seq(1, 3000)) - 1000
    assert text(result).endswith(f"\n\n[Showing lines 1001-3000 of 3000. The last 1000B of the output (from byte "
                                 f"{dropped}; what is before it reads as NUL bytes): {path}]")
    kept = box.read_file(path)
    assert kept == bytes(dropped) + seq(1, 3000).encode()[dropped:]


def test_the_process_limit_notice():
    result = bash(box_with(forks=Run("x\n", pids_limit_hit=True)), "forks")
    assert text(result) == "x\n\n\n" + PIDS_LIMIT_NOTICE and not result.is_error


def test_an_output_flood_that_outran_pids_trims_is_said():
    """A new user's test: `yes` filled pid's room for its output in under a second, failed writing, and the model saw
    only "Command exited with code 1"."""
    result = bash(box_with(flood=Run("y\ny\n", exit_code=1, output_lost=True)), "flood")
    assert text(result) == "y\ny\n\n\n" + OUTPUT_LOST_NOTICE + "\n\nCommand exited with code 1" and result.is_error


def test_a_full_disk_is_said_even_when_the_output_could_not_be():
    result = bash(box_with(fill=Run(exit_code=1, disk_full=True)), "fill")
    assert text(result) == DISK_FULL_NOTICE + "\n\nCommand exited with code 1" and result.is_error
    assert DISK_FULL_NOTICE.startswith("No space left on device, or nearly: ")   # (a write of 869K free had worked)


def test_escapes_and_control_characters_never_reach_the_model():
    result = bash(box_with(colour=Run(b"\x1b[1;31mred\x1b[0m plain\r\n\ttab\x07bell\x1b]0;title\x07 done\n")), "colour")
    assert text(result) == "red plain\n\ttabbell done\n"
    assert text(bash(box_with(latin=Run(b"ok \xff end\n")), "latin")) == "ok \ufffd end\n"


def test_live_updates_are_decoded_across_chunks_and_sanitised():
    euro = "€".encode()
    box = box_with(progress=Run(b"\x1b[32mone\x1b[0m\n", 0.05, b"two " + euro[:1], euro[1:] + b"\n"))
    updates: list[str] = []
    result = bash(box, "progress", on_update=updates.append)
    assert text(result) == "one\ntwo €\n"
    assert "".join(updates) == "one\ntwo €\n" and "\ufffd" not in "".join(updates)


def test_sandbox_failures_the_model_can_work_around_become_errors_and_loss_ends_the_job():
    def broken(command: str, box: MemorySandbox) -> Run:
        raise SandboxError("exec channel: unexpected reply")
    result = bash(MemorySandbox(broken), "anything")
    assert result.is_error and text(result) == "exec channel: unexpected reply"

    def lost(command: str, box: MemorySandbox) -> Run:
        raise SandboxLost("the sandbox container is gone")
    with pytest.raises(SandboxLost):
        bash(MemorySandbox(lost), "anything")


def test_a_sandbox_removed_while_a_command_runs_ends_the_call_with_sandbox_lost():
    box = box_with(long=Run(30.0))
    threading.Timer(0.1, box.kill).start()
    began = time.monotonic()
    with pytest.raises(SandboxLost):
        bash(box, "long")
    assert time.monotonic() - began < 2 and box.removed_by_pid and not box.is_alive()


def test_a_read_of_a_full_output_the_sandbox_has_removed_says_so():
    """The sandbox keeps only the newest full outputs (the Docker one: 1,000): a later read of one bash named to the
    model said only "File not found", as if the model had the name wrong."""
    box = box_with(long=Run(seq(1, 3000)))
    ctx, registry = ToolContext(box), default_registry()
    named = registry.execute(ToolCall("c1", "bash", {"command": "long"}), ctx)
    path = named.details["fullOutputPath"]
    assert text(registry.execute(ToolCall("c2", "read", {"path": path, "limit": 1}), ctx)).startswith("1\n")
    del box.files[path]
    gone = registry.execute(ToolCall("c3", "read", {"path": path}), ctx)
    assert gone.is_error and text(gone) == (f"File not found: {path} (an earlier command's full output: the sandbox "
                                            "keeps only the newest ones, and has removed this one)")
    assert text(registry.execute(ToolCall("c4", "read", {"path": "/.pid/out/99"}), ctx)) == \
        "File not found: /.pid/out/99"   # a name bash never gave is just not found
