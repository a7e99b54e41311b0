"""The job's check (`--check CMD`): after the agent ends, one command in the job's container decides.

It runs as the agent's commands do: through the sandbox's exec (the bash tool's path), in the workspace, as the
agent's user, its output bounded, its process group killed inside the container at its own timeout. What it leaves
in result.json (and the job's store record) is `Check.to_result()`: command, exit_code, passed, duration_s,
output_tail (the last OUTPUT_TAIL_LINES lines / OUTPUT_TAIL_BYTES bytes, as the bash tool cuts its tail), timed_out.

The runner collects the patch *before* the check runs (worker/runner.py): the patch is the agent's change, never
what the check wrote (bytecode caches, test reports, a formatter's rewrites).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from pid.sandbox import ExecResult, OutputPolicy, Sandbox
from pid.tools.bash import sanitize
from pid.tools.truncate import truncate_tail

OUTPUT_TAIL_LINES = 50
OUTPUT_TAIL_BYTES = 4096
# What exec keeps of the output: more than the tail, so that the cut lands on a line boundary after sanitising.
EXEC_TAIL_BYTES = 16384
MAX_COMMAND_CHARS = 100_000   # a command longer than this is a mistake (a file pasted in), refused at submit


@dataclass(frozen=True)
class Check:
    command: str
    exit_code: int | None      # None: killed (timed out, cancelled) or never ran
    passed: bool
    duration_s: float
    output_tail: str
    timed_out: bool = False
    cancelled: bool = False    # the job was cancelled while its check ran
    error: str | None = None   # the check could not run (the sandbox failed): it has not passed

    def to_result(self) -> dict[str, Any]:
        result: dict[str, Any] = {"command": self.command, "exit_code": self.exit_code, "passed": self.passed,
                                  "duration_s": self.duration_s, "output_tail": self.output_tail,
                                  "timed_out": self.timed_out}
        if self.cancelled:
            result["cancelled"] = True
        if self.error:
            result["error"] = self.error
        return result


def command_problem(command: str | None) -> str | None:
    """Why a --check command cannot be run, or None (checked before the job is queued)."""
    if command is None:
        return None
    if not command.strip():
        return "the check command is empty"
    if "\0" in command:
        return "the check command contains a NUL byte"
    if len(command) > MAX_COMMAND_CHARS:
        return f"the check command is longer than {MAX_COMMAND_CHARS} characters"
    return None


def run_check(sandbox: Sandbox, command: str, timeout_s: float,
              cancel: threading.Event | None = None) -> Check:
    """Run the check to its end (or its timeout, or the job's cancel). Raises what exec raises when the sandbox
    itself fails (SandboxError): the check did not run, which is not the same as failing."""
    started = time.monotonic()
    result = sandbox.exec(command, timeout=timeout_s, output=OutputPolicy(tail_bytes=EXEC_TAIL_BYTES), cancel=cancel)
    duration = round(time.monotonic() - started, 3)
    tail = output_tail(result)
    passed = result.exit_code == 0 and not result.timed_out and not result.cancelled
    return Check(command, result.exit_code, passed, duration, tail, timed_out=result.timed_out,
                 cancelled=result.cancelled)


def output_tail(result: ExecResult) -> str:
    """The output's last lines, bounded, without escape sequences; a first line that the buffer cut is dropped."""
    raw = result.tail
    if len(raw) < result.total_bytes:   # the buffer starts mid-line: that fragment is never shown
        newline = raw.find(b"\n")
        if 0 <= newline < len(raw) - 1:
            raw = raw[newline + 1:]
    text = sanitize(raw.decode("utf-8", "replace")).rstrip("\n")
    cut = truncate_tail(text.split("\n") if text else [], OUTPUT_TAIL_LINES, OUTPUT_TAIL_BYTES)
    return cut.content
