"""The seam between the agent core and wherever commands run.

Tools see only this Protocol: run a command, read a file, write a file. The agent core never imports docker; the
Docker implementation is the package pid.sandbox (the sandbox/ folder), and anything with these three methods will do
(the tests' in-memory one, tests/memory_sandbox.py, too). A sandbox's life around the tools (create, workspace in,
patch out, removal) is the runner's business: pid/sandbox_lifecycle.py. All paths are paths *inside* the sandbox.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, runtime_checkable


# A command whose first line is this runs even when the working directory is gone (which makes the agent's own
# commands fail as pi's do): for pid's helper commands that name absolute paths.
RUN_ANYWHERE = "#pid:anywhere\n"


class SandboxError(RuntimeError):
    """The sandbox itself failed (channel broke, container gone); not an error of the command."""


class BadWorkspace(SandboxError):
    """The job's workspace cannot be had as it was given: its repository's URL was reached and has no such branch,
    tag or commit, its file:// path is no directory on this worker, or its --workdir is no directory in the image.
    The input's fault, not the sandbox's: the job never ran, and no retry would help."""


class SandboxLost(SandboxError):
    """The sandbox is gone for good (its container was removed or stopped): the job cannot go on.

    Tools let it through instead of reporting it to the model, and the loop ends the job with `sandbox_error`.
    """


@dataclass(frozen=True)
class OutputPolicy:
    """How much of a command's output its caller gets back, and when the whole of it is kept in a file.

    The tail bounds the caller's memory whatever the command prints. The full output is kept (ExecResult.output_path)
    when it is longer than the tail, or than `keep_lines` lines or `keep_bytes` bytes when given: what a caller shows
    less of than the whole must still be reachable.
    """
    tail_bytes: int = 65536
    keep_lines: int | None = None
    keep_bytes: int | None = None

    def keeps(self, total_bytes: int, total_lines: int) -> bool:
        """Whether an output of this size is kept in a file (lines counted as ExecResult.total_lines counts them)."""
        return (total_bytes > self.tail_bytes or (self.keep_lines is not None and total_lines > self.keep_lines)
                or (self.keep_bytes is not None and total_bytes > self.keep_bytes))


DEFAULT_OUTPUT = OutputPolicy()


@dataclass
class ExecResult:
    exit_code: int | None      # None when the command was killed (timeout or cancel)
    tail: bytes                # the last `output.tail_bytes` bytes of stdout+stderr, merged
    total_bytes: int           # size of the whole output
    total_lines: int           # lines in the whole output (a final line without newline counts)
    timed_out: bool = False
    cancelled: bool = False
    output_path: str | None = None  # in-sandbox file with the full output, when kept
    output_from: int = 0            # the kept file starts at this byte of the output (its front was dropped: size cap)
    pids_limit_hit: bool = False    # the process limit refused a fork meanwhile (the agent's processes were killed)
    disk_full: bool = False         # the job's disk was full as the command ended (the agent's writes failed)
    out_of_memory: bool = False     # the memory limit made the kernel kill a process meanwhile (a failed command)
    output_lost: bool = False       # its output filled the room kept for it (a flood faster than pid trims it): the
                                    # rest was lost, and the command's writes to its output failed


@runtime_checkable
class Sandbox(Protocol):
    workdir: str  # where relative paths resolve and commands start, e.g. "/workspace"

    def exec(self, command: str, *, timeout: float, output: OutputPolicy = DEFAULT_OUTPUT,
             on_output: Callable[[bytes], None] | None = None,
             cancel: threading.Event | None = None) -> ExecResult:
        """Run `bash -c command` (sh where bash is missing) in `workdir`, stdin at EOF, in its own process group.

        On timeout or cancel the whole process group is killed inside the sandbox before this returns.
        What comes back of the output, and when all of it is kept in a file, is `output`'s (see OutputPolicy).
        `on_output`, when given, receives throttled chunks of recent output while the command runs (for live
        progress only).
        """
        ...

    def read_file(self, path: str, *, max_bytes: int | None = None, timeout: float = 120.0,
                  cancel: threading.Event | None = None) -> bytes:
        """The file's bytes, at most `max_bytes` from its start (an implementation may cap it further).

        Raises FileNotFoundError, IsADirectoryError or PermissionError like the builtins, OSError for a path that is
        not a regular file (a FIFO or device would block), TimeoutError after `timeout`, InterruptedError on cancel;
        SandboxError when the sandbox itself fails.
        """
        ...

    def readable_files(self, paths: Sequence[str], *, timeout: float = 120.0) -> set[str]:
        """Which of `paths` are regular files the agent can read, in one look (a job's start asks after six:
        its context files); TimeoutError after `timeout`, SandboxError when the sandbox itself fails."""
        ...

    def write_file(self, path: str, data: bytes, *, timeout: float = 120.0,
                   cancel: threading.Event | None = None) -> None:
        """Create or overwrite the file (parents created), keeping the mode of an existing file. Errors as read_file;
        OSError(ENOSPC) when the job's disk is full."""
        ...
