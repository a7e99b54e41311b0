"""An in-memory sandbox for Docker-free tests: both seams (pid.sandbox_api.Sandbox for the tools,
pid.sandbox_lifecycle.JobSandbox/SandboxProvider for the runner) with files in a dict and no shell.

Files live under absolute in-sandbox paths; directories are implied by the files below them (or made explicitly in
`dirs`). Errors are the Docker sandbox's: FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
OSError(EINVAL) for a FIFO or device, OSError(ENOSPC) for a full disk, TimeoutError, InterruptedError, SandboxLost
once the sandbox was killed or closed.

`exec` runs no command: a handler says what the command does, as a `Run` of output pieces and pauses, then its
exit code. Timeouts, cancel, the output policy (tail, totals, the kept full-output file) and on_output are this
class's, so the bash tool's own logic can be tested without a shell. Real-shell behaviour is the Docker tier's.
"""
from __future__ import annotations

import difflib
import errno
import os
import posixpath
import re
import shlex
import tarfile
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Mapping, Sequence, Union

from pid.sandbox_api import DEFAULT_OUTPUT, ExecResult, OutputPolicy, SandboxError, SandboxLost
from pid.sandbox_lifecycle import FilesBudget, PatchCopy, Skipped

Step = Union[bytes, str, float, int]   # output (bytes or UTF-8 text), or a pause in seconds
POLL_S = 0.005                         # how often a pause looks at cancel and kill
OUTPUT_DIR = "/.pid/out"               # where kept outputs go, as in the Docker sandbox


@dataclass(init=False)
class Run:
    """What a command does: its steps in order (output, or a pause in seconds), then its exit. exit_code None is a
    command killed from outside (neither timeout nor cancel)."""
    steps: tuple[Step, ...]
    exit_code: int | None = 0
    pids_limit_hit: bool = False
    disk_full: bool = False
    output_lost: bool = False

    def __init__(self, *steps: Step, exit_code: int | None = 0, pids_limit_hit: bool = False,
                 disk_full: bool = False, output_lost: bool = False) -> None:
        self.steps, self.exit_code, self.pids_limit_hit, self.disk_full = steps, exit_code, pids_limit_hit, disk_full
        self.output_lost = output_lost


Handler = Callable[[str, "MemorySandbox"], Run]


class Commands:
    """A handler from a table: command -> Run, or -> handler(command, box) for one that looks at the files. An
    unknown command prints bash's complaint and exits 127, so a test never passes on a command it did not expect."""

    def __init__(self, table: Mapping[str, Run | Handler] | None = None) -> None:
        self.table: dict[str, Run | Handler] = dict(table or {})

    def __setitem__(self, command: str, run: Run | Handler) -> None:
        self.table[command] = run

    def __call__(self, command: str, box: "MemorySandbox") -> Run:
        entry = self.table.get(command)
        if entry is None:
            return Run(f"bash: {command.split(' ', 1)[0]}: command not found\n", exit_code=127)
        return entry if isinstance(entry, Run) else entry(command, box)


@dataclass
class ExecCall:
    """One exec, as the sandbox saw it (for assertions)."""
    command: str
    timeout: float
    output: OutputPolicy
    result: ExecResult | None = None   # None until it returned (or when it raised)


def _error(kind: type[OSError], code: int, path: str) -> OSError:
    return kind(code, os.strerror(code), path)


class MemorySandbox:
    """JobSandbox in memory. Thread-safe; every call may run concurrently with the others."""

    def __init__(self, handler: Handler | Mapping[str, Run | Handler] | None = None, *,
                 workdir: str = "/workspace", files: Mapping[str, bytes | str] | None = None) -> None:
        self.workdir = workdir
        self.handler: Handler = handler if callable(handler) else Commands(handler)
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = {"/", workdir, OUTPUT_DIR}      # besides those implied by files
        self.special: set[str] = set()       # FIFOs, sockets, devices: refused, never read or written
        self.denied: set[str] = set()        # paths the agent may not read or write
        self.disk_bytes: int | None = None   # all files together may hold at most this; None: no limit
        self.file_delay_s = 0.0              # each read_file/write_file takes this long (to test their timeouts)
        self.keep_output_max: int | None = None   # a kept output holds only its last this-many bytes (its front
        #                                           reads as NUL bytes, as after the Docker sandbox's trimming)
        self.calls: list[ExecCall] = []
        self.looks: list[list[str]] = []   # each readable_files call's paths
        self.removed_by_pid = False
        self.closed = False
        self.base: dict[str, bytes] | None = None   # the workspace as import_workspace left it
        self._gone = threading.Event()
        self._lock = threading.RLock()
        self._outputs = 0
        for path, data in (files or {}).items():
            self.files[self._abs(path)] = data.encode() if isinstance(data, str) else bytes(data)

    # -- the tools' Sandbox -----------------------------------------------------------------------------------
    @property
    def commands(self) -> list[str]:
        return [call.command for call in self.calls]

    def exec(self, command: str, *, timeout: float, output: OutputPolicy = DEFAULT_OUTPUT,
             on_output: Callable[[bytes], None] | None = None,
             cancel: threading.Event | None = None) -> ExecResult:
        """The handler's Run, played in real time. on_output gets each piece as it is printed (Docker's gets
        throttled chunks: a test may rely on what arrives, not on how it is cut)."""
        self._check_alive()
        call = ExecCall(command, timeout, output)
        with self._lock:
            self.calls.append(call)
        run = self._git_apply(command) if " git apply " in command else self.handler(command, self)
        deadline = time.monotonic() + timeout
        out = bytearray()
        stop = None
        for step in run.steps:
            stop = "cancelled" if cancel is not None and cancel.is_set() else None
            if stop:
                break
            if isinstance(step, (int, float)):
                stop = self._pause(step, deadline, cancel)
                if stop:
                    break
            else:
                chunk = step.encode() if isinstance(step, str) else bytes(step)
                out += chunk
                if on_output is not None and chunk:
                    on_output(chunk)
        else:
            stop = "cancelled" if cancel is not None and cancel.is_set() else None   # while its last step ran
        call.result = self._result(bytes(out), output, None if stop else run.exit_code, stop, run.pids_limit_hit,
                                   run.disk_full, run.output_lost)
        return call.result

    def _git_apply(self, command: str) -> "Run":
        """`git apply` of a patch in export_patch's own format (pid.jobs.continuation.apply_patch's command): its
        --directory, its --exclude patterns (a path, or a path and `/*`), new, changed and deleted text files."""
        words = shlex.split(command.split(" git apply ", 1)[1].split(";")[0])
        directory = next(w.split("=", 1)[1] for w in words if w.startswith("--directory="))
        excluded = [re.sub(r"\\(.)", r"\1", w.split("=", 1)[1]) for w in words if w.startswith("--exclude=")]
        patch = self.files[self._abs(words[-1])].decode()
        for section in re.split(r"(?m)^(?=diff --git )", patch):
            if not section.startswith("diff --git "):
                continue
            name = section.split("\n", 1)[0].split(" b/", 1)[1]
            path = posixpath.join(directory, name)
            if any(path == e or (e.endswith("/*") and path.startswith(e[:-1])) for e in excluded):
                continue
            target = "/" + path
            if "\ndeleted file mode" in section:
                self.files.pop(target, None)
                continue
            old = self.files.get(target, b"").decode().splitlines(keepends=True)
            new: list[str] = []
            at = 0
            for hunk in re.split(r"(?m)^(?=@@ )", section)[1:]:
                start = int(re.match(r"@@ -(\d+)", hunk).group(1))   # type: ignore[union-attr]
                start = max(start - 1, 0) if not hunk.startswith("@@ -0,0") else 0
                new += old[at:start]
                at = start
                for line in hunk.splitlines(keepends=True)[1:]:
                    if line.startswith((" ", "-")):
                        at += 1
                    if line.startswith((" ", "+")):
                        new.append(line[1:])
            self.files[target] = "".join(new + old[at:]).encode()
        return Run("")

    def _pause(self, seconds: float, deadline: float, cancel: threading.Event | None) -> str | None:
        """Sleep as a command would; "timed_out" or "cancelled" when that ends it first. SandboxLost on kill."""
        end = time.monotonic() + seconds
        while True:
            if cancel is not None and cancel.is_set():
                return "cancelled"
            self._check_alive()
            now = time.monotonic()
            if now >= min(end, deadline):
                return None if end <= deadline else "timed_out"
            self._gone.wait(min(POLL_S, min(end, deadline) - now))

    def _result(self, data: bytes, output: OutputPolicy, exit_code: int | None, stop: str | None,
                pids_limit_hit: bool, disk_full: bool = False, output_lost: bool = False) -> ExecResult:
        lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
        kept, kept_from = None, 0
        if output.keeps(len(data), lines):
            if self.keep_output_max is not None and len(data) > self.keep_output_max:
                kept_from = len(data) - self.keep_output_max
            with self._lock:
                self._outputs += 1
                kept = f"{OUTPUT_DIR}/{self._outputs}"
                self.files[kept] = bytes(kept_from) + data[kept_from:]
        tail = data[max(0, len(data) - output.tail_bytes):] if output.tail_bytes > 0 else b""
        return ExecResult(exit_code=exit_code, tail=tail, total_bytes=len(data),
                          total_lines=lines,
                          timed_out=stop == "timed_out", cancelled=stop == "cancelled", output_path=kept,
                          output_from=kept_from, pids_limit_hit=pids_limit_hit, disk_full=disk_full,
                          output_lost=output_lost)

    def read_file(self, path: str, *, max_bytes: int | None = None, timeout: float = 120.0,
                  cancel: threading.Event | None = None) -> bytes:
        target = self._abs(path)
        self._file_wait(target, timeout, cancel)
        with self._lock:
            if self._is_dir(target):
                raise _error(IsADirectoryError, errno.EISDIR, target)
            if target not in self.files and target not in self.special:
                raise _error(FileNotFoundError, errno.ENOENT, target)
            if target in self.denied:
                raise _error(PermissionError, errno.EACCES, target)
            if target in self.special:
                raise _error(OSError, errno.EINVAL, target)
            data = self.files[target]
        return data if max_bytes is None else data[:max(0, max_bytes)]

    def readable_files(self, paths: Sequence[str], *, timeout: float = 120.0) -> set[str]:
        with self._lock:
            self.looks.append(list(paths))
            return {p for p in paths if (t := self._abs(p)) in self.files and t not in self.denied}

    def write_file(self, path: str, data: bytes, *, timeout: float = 120.0,
                   cancel: threading.Event | None = None) -> None:
        target = self._abs(path)
        self._file_wait(target, timeout, cancel)
        data = bytes(data)
        with self._lock:
            if any(parent in self.files or parent in self.special for parent in _parents(target)):
                raise _error(NotADirectoryError, errno.ENOTDIR, target)
            if self._is_dir(target):
                raise _error(IsADirectoryError, errno.EISDIR, target)
            if target in self.special:
                raise _error(OSError, errno.EINVAL, target)
            if target in self.denied:
                raise _error(PermissionError, errno.EACCES, target)
            if self.disk_bytes is not None:
                used = sum(len(v) for k, v in self.files.items() if k != target)
                if used + len(data) > self.disk_bytes:
                    self.files[target] = b""   # the file is truncated before the write fails, as on a full disk
                    raise _error(OSError, errno.ENOSPC, target)
            self.files[target] = data

    # -- helpers ---------------------------------------------------------------------------------------------------
    def _abs(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def _is_dir(self, path: str) -> bool:
        prefix = path.rstrip("/") + "/"
        return path in self.dirs or any(name.startswith(prefix) for name in (*self.files, *self.special))

    def _check_alive(self) -> None:
        if self._gone.is_set():
            raise SandboxLost("the sandbox was removed")

    def _file_wait(self, path: str, timeout: float, cancel: threading.Event | None) -> None:
        self._check_alive()
        if cancel is not None and cancel.is_set():
            raise InterruptedError(f"cancelled: {path}")
        if self.file_delay_s:
            stop = self._pause(self.file_delay_s, time.monotonic() + timeout, cancel)
            if stop == "cancelled":
                raise InterruptedError(f"cancelled: {path}")
            if stop == "timed_out":
                raise TimeoutError(f"no answer within {timeout:g}s: {path}")

    def listdir(self, directory: str) -> list[str]:
        """Names directly in `directory` (for tests and handlers that look around)."""
        prefix = self._abs(directory).rstrip("/") + "/"
        names = {p[len(prefix):].split("/", 1)[0] for p in (*self.files, *self.special, *self.dirs)
                 if p.startswith(prefix) and len(p) > len(prefix)}
        return sorted(names)

    # -- the runner's side (JobSandbox) ---------------------------------------------------------------------------
    def is_alive(self) -> bool:
        return not self._gone.is_set()

    def kill(self) -> None:
        self.removed_by_pid = True
        self._gone.set()

    def close(self) -> None:
        self.closed = True
        self._gone.set()

    def __enter__(self) -> "MemorySandbox":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def import_workspace(self, host_path: str, timeout: float = 600.0) -> None:
        """The host directory's regular files (links not followed, `.git` left out) into workdir."""
        self._check_alive()
        if not os.path.isdir(host_path):
            raise SandboxError(f"cannot copy workspace into the sandbox: {host_path} is not a directory")
        for root, dirs, names in os.walk(host_path):
            dirs[:] = [d for d in dirs if d != ".git" and not os.path.islink(os.path.join(root, d))]
            rel = os.path.relpath(root, host_path)
            inside = posixpath.normpath(posixpath.join(self.workdir, rel.replace(os.sep, "/")))
            self.dirs.add(inside)
            for name in names:
                host = os.path.join(root, name)
                if os.path.isfile(host) and not os.path.islink(host):
                    with open(host, "rb") as f:
                        self.files[posixpath.join(inside, name)] = f.read()
        self.base = self._workspace()

    def import_tar(self, stream: IO[bytes], timeout: float = 600.0) -> None:
        """A workspace tar's regular files into workdir, under the same member checks as the Docker sandbox."""
        from pid.sandbox.workspace import MemberCheck, UnsafeTar
        self._check_alive()
        check = MemberCheck(0, 0)
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    info = check(member)
                    if info is None:
                        continue
                    path = posixpath.join(self.workdir, info.name)
                    if info.isdir():
                        self.dirs.add(path)
                    elif info.isreg():
                        fileobj = tar.extractfile(member)
                        assert fileobj is not None
                        self.files[path] = fileobj.read()
        except (UnsafeTar, tarfile.TarError) as exc:
            raise SandboxError(f"the workspace archive was refused: {exc}") from exc
        self.base = self._workspace()

    def import_image(self, timeout: float = 600.0) -> None:
        """The files the sandbox was made with are the image's workdir: they are the base."""
        self._check_alive()
        self.base = self._workspace()

    def import_git(self, url: str, ref: str | None, timeout: float = 600.0) -> str:
        """No git here: the Docker sandbox clones (tests of git URLs are in the Docker tier)."""
        raise SandboxError(f"cannot clone {url}: the in-memory sandbox has no git")

    def _workspace(self) -> dict[str, bytes]:
        prefix = self.workdir.rstrip("/") + "/"
        with self._lock:
            return {p[len(prefix):]: data for p, data in self.files.items() if p.startswith(prefix)}

    def export_patch(self, dest: str, max_bytes: int, timeout: float = 600.0) -> PatchCopy:
        """A git-style diff of the workspace since import_workspace (text files; binary ones named as differing)."""
        self._check_alive()
        if self.base is None:
            raise SandboxError("no base commit: import_workspace was not called")
        now = self._workspace()
        parts: list[str] = []
        for name in sorted(set(self.base) | set(now)):
            old, new = self.base.get(name), now.get(name)
            if old == new:
                continue
            parts.append(f"diff --git a/{name} b/{name}\n")
            if old is None:
                parts.append("new file mode 100644\n")
            elif new is None:
                parts.append("deleted file mode 100644\n")
            try:
                old_lines = (old or b"").decode().splitlines(keepends=True)
                new_lines = (new or b"").decode().splitlines(keepends=True)
            except UnicodeDecodeError:
                parts.append(f"Binary files a/{name} and b/{name} differ\n")
                continue
            parts.extend(difflib.unified_diff(old_lines, new_lines, "/dev/null" if old is None else f"a/{name}",
                                              "/dev/null" if new is None else f"b/{name}"))
        patch = "".join(parts).encode()
        if len(patch) > max_bytes:
            raise SandboxError(f"the patch is {len(patch)} bytes, over the {max_bytes}-byte limit")
        with open(dest, "wb") as f:
            f.write(patch)
        return PatchCopy(len(patch), [])

    def export_files(self, paths: list[str], dest_dir: str, budget: FilesBudget) -> tuple[list[str], list[Skipped]]:
        """Files (or every file below a directory) under dest_dir at their in-sandbox paths, within the budget."""
        self._check_alive()
        written: list[str] = []
        skipped: list[Skipped] = []
        for path in paths:
            target = self._abs(path)
            with self._lock:
                found = sorted(p for p in self.files if p == target or p.startswith(target.rstrip("/") + "/"))
            if not found:
                skipped.append(Skipped(path, "not found"))
                continue
            for name in found:
                data = self.files[name]
                if budget.stopped is None and budget.used_bytes + len(data) > budget.max_bytes:
                    skipped.append(Skipped(name, f"over the {budget.max_bytes}-byte limit"))
                    continue
                if budget.stopped is None and budget.used_entries + 1 > budget.max_entries:
                    budget.stopped = f"over the {budget.max_entries}-entry limit"
                if budget.stopped is not None:
                    skipped.append(Skipped(name, budget.stopped))
                    continue
                host = os.path.join(dest_dir, name.lstrip("/"))
                os.makedirs(os.path.dirname(host), exist_ok=True)
                with open(host, "wb") as f:
                    f.write(data)
                budget.used_bytes += len(data)
                budget.used_entries += 1
                written.append(host)
        return written, skipped


def _parents(path: str) -> list[str]:
    """Every ancestor of an absolute path, nearest last, "/" excluded."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


@dataclass
class MemoryProvider:
    """SandboxProvider of MemorySandboxes, all answering commands with one handler; remembers what it did."""
    handler: Handler | Mapping[str, Run | Handler] | None = None
    created: list[MemorySandbox] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)

    def create(self, config: Any, workspace: Any = None) -> MemorySandbox:
        box = MemorySandbox(self.handler, workdir=getattr(config, "workdir", "/workspace"))
        self.created.append(box)
        return box

    def clear_job(self, job_id: str) -> None:
        self.cleared.append(job_id)
