"""Whether the container's memory limit made the kernel kill a process, read on the host from its cgroup.

Why: a process the kernel kills for memory dies of SIGKILL (status 137) with no word of why, and when the kernel
picks one of pid's own servers (pages in /dev/shm cannot be reclaimed, so killing the agent's shell frees nothing) the
call fails as a closed channel. Either way the model and the user are told the container ran out of memory. The
count is the cgroup's `oom_kill` (v2 memory.events, v1 memory.oom_control), which nothing in the container can
write; it is read as each call starts and as it ends (one read of an open file, ~2 µs each), so a kill is told for
the call it happened in, whether or not the command's status shows it (a background process, `cmd; echo $?`). Where
the host cannot see the container's cgroup (a worker in a container of its own), nothing is said, as before; under
gVisor the kernel kills the whole sandbox, which the engine may say.
"""
from __future__ import annotations

import os
import threading

from .launch import Container
from .processes import cgroup_dir, engine_cgroup_dirs

OUT_OF_MEMORY = ("the container ran out of memory: the kernel killed processes to free memory (its --memory limit; "
                 "files in /dev/shm count against it)")
OUT_OF_MEMORY_EARLIER = ("the container ran out of memory during the job, and the kernel may have killed pid's own "
                         "processes in it: its --memory limit; files in /dev/shm count against it")


def _oom_kills(fd: int) -> int:
    """The `oom_kill N` line of an open memory.events or memory.oom_control."""
    text = b"\n" + os.pread(fd, 4096, 0)
    at = text.find(b"\noom_kill ")
    if at < 0:
        raise ValueError("no oom_kill line")
    return int(text[at + 10:].partition(b"\n")[0])


def _open_counter(container: Container) -> int | None:
    """An open descriptor of the container's memory.events (v2) or memory.oom_control (v1), or None."""
    fd = _first_counter(engine_cgroup_dirs(container.id, "memory"))
    if fd is None:   # (elsewhere: where the container's first process is, which costs an engine request)
        init_pid = container.init_pid()
        try:
            found = cgroup_dir(init_pid, "memory") if init_pid else None
        except (OSError, ValueError):
            found = None
        fd = _first_counter([found]) if found else None
    return fd


def _first_counter(dirs: list[str]) -> int | None:
    for path in dirs:
        for name in ("memory.events", "memory.oom_control"):
            try:
                fd = os.open(os.path.join(path, name), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                _oom_kills(fd)
                return fd
            except (OSError, ValueError):
                os.close(fd)
    return None


class MemoryWatch:
    """The container's out-of-memory kills as last seen. Thread-safe."""

    UNOPENED, UNREADABLE = -2, -1

    def __init__(self, container: Container) -> None:
        self.container = container
        self.seen = 0
        self._fd = self.UNOPENED
        self._lock = threading.Lock()

    def mark(self) -> None:
        """The agent's first call starts: what the kernel killed before it is not the agent's doing (one read of an
        open file). A kill after it, during a call or between two (a server left running), is told once, by the
        next call to end (ran_out)."""
        with self._lock:
            self._look()

    def ran_out(self) -> bool:
        """Whether the kernel killed a process for memory since the mark, or since the last time this said so."""
        with self._lock:
            before = self.seen
            return self._look() > before

    def ever_ran_out(self) -> bool:
        """Whether the kernel ever killed a process of the container for memory (pid's own may have been one)."""
        with self._lock:
            return self._look() > 0

    def _look(self) -> int:
        """The count now (the last one seen where it cannot be read any more)."""
        if self._fd == self.UNOPENED:
            fd = _open_counter(self.container)
            self._fd = self.UNREADABLE if fd is None else fd
        if self._fd >= 0:
            try:
                self.seen = max(self.seen, _oom_kills(self._fd))
            except (OSError, ValueError):
                pass
        return self.seen

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, self.UNREADABLE
            if fd >= 0:
                os.close(fd)
