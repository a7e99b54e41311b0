"""The job's check (`--check CMD`): after the agent ends, one command decides, on the agent's patch alone.

It never runs in the agent's container: whatever the agent left there besides its patch (a `.pth` in its home, a
bytecode cache that .gitignore hides, a process) would be judged with it, and the patch is what a user applies. So
the runner (worker/runner.py) makes a fresh sandbox of the same image and limits, puts the original workspace in it
(the image's own directory, or the same snapshot), applies patch.diff as the agent's user, leaving out the paths of
`--check-original` (they stay as the original has them: the tests that judge the agent), and runs CMD there: through
the sandbox's exec (the bash tool's path), in the workdir, as the agent's user, its output bounded, its process
group killed inside the container at its own timeout.

What it leaves in result.json (and the job's store record) is `Check.to_result()`: command, exit_code, passed,
duration_s, output_tail (the last OUTPUT_TAIL_LINES lines / OUTPUT_TAIL_BYTES bytes, as the bash tool cuts its tail),
timed_out, ran_on ("patch"), original (the --check-original paths) and out_of_memory (when the kernel killed
processes of its container for memory meanwhile).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from pid.sandbox_api import ExecResult, OutputPolicy, Sandbox
from pid.terminal import strip_escapes
from pid.tools.truncate import split_lines, truncate_tail

OUTPUT_TAIL_LINES = 50
OUTPUT_TAIL_BYTES = 4096
# What exec keeps of the output: more than the tail, so that the cut lands on a line boundary after sanitising.
EXEC_TAIL_BYTES = 16384


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
    original: tuple[str, ...] = ()   # the workspace paths it saw as the original has them (--check-original)
    original_missing: tuple[str, ...] = ()   # those of them the original does not have (a misspelt path?)
    unapplied: bool = False    # the error: the job's patch does not apply to the workspace it was made from
    out_of_memory: bool = False   # the kernel killed processes of its container for memory meanwhile (--memory)

    def to_result(self) -> dict[str, Any]:
        result: dict[str, Any] = {"command": self.command, "exit_code": self.exit_code, "passed": self.passed,
                                  "duration_s": self.duration_s, "output_tail": self.output_tail,
                                  "timed_out": self.timed_out, "ran_on": "patch"}
        if self.original:
            result["original"] = list(self.original)
        if self.original_missing:
            result["original_missing"] = list(self.original_missing)
        if self.cancelled:
            result["cancelled"] = True
        if self.out_of_memory:   # (a limit, not the patch, may have failed it)
            result["out_of_memory"] = True
        if self.error:
            result["error"] = self.error
        return result


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
                 cancelled=result.cancelled, out_of_memory=result.out_of_memory)


def output_tail(result: ExecResult) -> str:
    """The output's last lines, bounded, without escape sequences; a first line that the buffer cut is dropped."""
    raw = result.tail
    if len(raw) < result.total_bytes:   # the buffer starts mid-line: that fragment is never shown
        newline = raw.find(b"\n")
        if 0 <= newline < len(raw) - 1:
            raw = raw[newline + 1:]
    text = strip_escapes(raw.decode("utf-8", "replace")).rstrip("\n")
    cut = truncate_tail(split_lines(text), OUTPUT_TAIL_LINES, OUTPUT_TAIL_BYTES)
    return cut.content
