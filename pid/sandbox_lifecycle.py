"""A job's sandbox around the tools: made from a config, the workspace copied in, the results copied out, removed.

The runner sees only these Protocols, so it does not care where commands run: `pid.sandbox.DockerProvider` makes
containers, the tests' `MemoryProvider` (tests/memory_sandbox.py) keeps everything in a dict. The tools never see
this side of a sandbox (pid/sandbox_api.py is theirs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Protocol, TypeVar, runtime_checkable

from pid.sandbox_api import Sandbox


@dataclass
class Skipped:
    """A member or patch section that was not written, and why (shown to the user, so never raw)."""
    path: str      # the offending name as pid.terminal.escaped shows it: at most 300 chars
    reason: str


@dataclass
class PatchCopy:
    size: int                   # bytes written to dest
    dropped: list[Skipped]      # file sections removed from the patch, with reasons


@dataclass
class FilesBudget:
    """Limits shared by several extract_files calls (one per requested path) so they cap the whole collection.

    Entries are filesystem objects created, parent directories made on the way included. A file over the bytes
    left is skipped alone (a smaller one after it may fit: a big log asked for first must not cost the small reports
    after it). Once the entry limit is hit, `stopped` holds the reason and every later member, in this call or a
    later one, is skipped with it.
    """
    max_bytes: int
    max_entries: int
    used_bytes: int = 0
    used_entries: int = 0
    stopped: str | None = None


@runtime_checkable
class JobSandbox(Sandbox, Protocol):
    """One job's sandbox: what the tools use, plus what the runner does before and after them."""

    removed_by_pid: bool   # pid removed it on purpose (kill(), a watchdog): nothing is collected from it

    def import_workspace(self, host_path: str, timeout: float = 600.0) -> None:
        """Copy a host directory into workdir and record it as the base of the patch (the host side is only read)."""
        ...

    def import_tar(self, stream: IO[bytes], timeout: float = 600.0) -> None:
        """Unpack a workspace tar read from `stream` into workdir and record it as the base of the patch. The tar may
        come from another machine: members are checked (relative names, no '..', nothing through a link, regular
        files, directories and links only), and a refused one fails the import (SandboxError)."""
        ...

    def import_git(self, url: str, ref: str | None, timeout: float = 600.0) -> str:
        """Clone a git URL at `ref` (branch, tag or commit id; None: the default branch) into workdir, git running
        in the sandbox's world, never on the host; record it as the base of the patch. Returns the commit id."""
        ...

    def import_image(self, timeout: float = 600.0) -> None:
        """The workspace is the sandbox image's own workdir, as the image has it: record it as the base of the patch
        (perhaps while the agent already works: export_patch waits for it)."""
        ...

    def export_patch(self, dest: str, max_bytes: int, timeout: float = 600.0) -> PatchCopy:
        """Write the workspace's changes since import_workspace to host file `dest`, at most `max_bytes`."""
        ...

    def export_files(self, paths: list[str], dest_dir: str, budget: FilesBudget) -> tuple[list[str], list[Skipped]]:
        """Copy in-sandbox files or directories under `dest_dir`, at their in-sandbox paths; (host paths written,
        what was skipped and why)."""
        ...

    def is_alive(self) -> bool:
        """The sandbox still exists and runs."""
        ...

    def kill(self) -> None:
        """Remove the sandbox now, from any thread: every wait on it ends (the watchdog's tool)."""
        ...

    def close(self) -> None:
        """Remove the sandbox and what it holds. Idempotent; never raises."""
        ...


ConfigT = TypeVar("ConfigT", contravariant=True)


class SandboxProvider(Protocol[ConfigT]):
    """Makes job sandboxes. The config's type is the provider's own (pid.sandbox.SandboxConfig for Docker)."""

    def create(self, config: ConfigT, workspace: IO[bytes] | None = None) -> JobSandbox:
        """A started sandbox the caller owns (and closes). Raises SandboxError (or a subclass) when it cannot.

        `workspace`: the job's workspace tar, which the provider may start unpacking while the sandbox starts;
        import_tar(workspace) then finishes the import (or does all of it)."""
        ...

    def clear_job(self, job_id: str) -> None:
        """Remove what an earlier attempt of this job left behind (its worker died before cleaning up)."""
        ...


__all__ = ["JobSandbox", "SandboxProvider", "Skipped", "PatchCopy", "FilesBudget"]
