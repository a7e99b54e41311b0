"""The output files of finished commands, on pid's own disk: removed, or kept for the model within a budget.

Why: pid's disk (see launch.PID_DISK) holds only pid's files, so that whatever the agent does to the job's disk, a
command's output can still be written and the patch still made. The agent's commands write their output there, and
nothing else of the agent's: so the host bounds what stays. An output the model was shown whole is removed while a
later command runs (commands.py: OutputFiles.housekeeping; a read of the `read` tool leaves up to 8 MB), by the host
alone: pid's server is told to leave the agent's outputs (channel_hello.sh: `h n o`), for one it removed first could
not be held and cut back (see remove). One kept for the model (it was longer than what the model is shown, which
names the file) stays, the newest first, up to KEPT_BYTES and KEPT_FILES for all of them (nor can many small ones use
up the inodes). All of this runs on the host, through the output directory's descriptor: names are pid's own (`N.M`,
validated by the channel), never followed.
"""
from __future__ import annotations

import os
import stat
from collections import deque

KEPT_BYTES = 256 << 20   # the kept outputs, together; the newest is kept whatever its size
KEPT_FILES = 1000
LINGER_BYTES = 1 << 20   # a removed output that a process left behind still writes is cut back past this...
LINGERING = 32           # ...for this many of the last removed outputs
HELD_BYTES = 64 << 10    # a removed output is emptied at once past this (its descriptor is held: see remove)


def remove(dir_fd: int, name: str, trimmed: bool = True) -> int | None:
    """Remove output file `name` and, if it was `trimmed`, its trimming record (a root agent may have put a directory
    there; only pid's trims make a record, and one fewer look-up is ~25 us of the host's CPU per command).
    The file is emptied first when it takes more than HELD_BYTES: a process the command left behind (`server &`)
    may hold it open and write on, and an unlinked file's blocks stay taken while it does (and while the returned
    descriptor is held). Returns a descriptor of the file, to cut it back again later (None: there was no regular
    file). A small one is left as it is: most outputs are, and emptying one costs a journal transaction."""
    fd: int | None = None
    try:
        fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            if st.st_blocks * 512 > HELD_BYTES:
                os.ftruncate(fd, 0)
        else:
            os.close(fd)
            fd = None
    except OSError:
        if fd is not None:
            os.close(fd)
            fd = None
    for victim in (name, name + ".cut") if trimmed else (name,):
        try:
            os.unlink(victim, dir_fd=dir_fd)
        except OSError:
            pass
    return fd


def used(dir_fd: int, name: str) -> int:
    """Bytes output file `name` takes on disk (its trimmed front is a hole: not counted); 0 when it is gone."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_blocks * 512
    except OSError:
        return 0


class KeptOutputs:
    """Which finished outputs stay on pid's disk. Not thread-safe: the caller holds the directory's lock."""

    def __init__(self, budget: int = KEPT_BYTES, files: int = KEPT_FILES) -> None:
        self.budget, self.files = budget, files
        self._names: deque[str] = deque()   # oldest first
        self._lingering: deque[int] = deque()   # the last removed outputs, emptied (see remove), oldest first

    def _remove(self, dir_fd: int, name: str, trimmed: bool = True) -> None:
        fd = remove(dir_fd, name, trimmed)
        if fd is not None:
            self._lingering.append(fd)
            if len(self._lingering) > LINGERING:
                os.close(self._lingering.popleft())

    def sweep(self, dir_fd: int) -> None:
        """Processes a command left behind cannot fill pid's disk through its output: kept outputs they grew past the
        budget go (oldest first), and removed ones they wrote more than LINGER_BYTES into since are cut back. The
        host calls it as a command starts (at most once a second) and every second while one runs."""
        sizes = [used(dir_fd, n) for n in self._names]
        total = sum(sizes)
        for size in sizes:
            if total <= self.budget:
                break
            self._remove(dir_fd, self._names.popleft())
            total -= size
        for fd in self._lingering:
            try:
                if os.fstat(fd).st_blocks * 512 > LINGER_BYTES:
                    os.ftruncate(fd, 0)
            except OSError:
                pass

    def close(self) -> None:
        """Let go of the removed outputs (before pid's disk is unmounted)."""
        while self._lingering:
            os.close(self._lingering.popleft())

    def finished(self, dir_fd: int, name: str, kept: bool, trimmed: bool = True) -> None:
        """A command's reply was read: its output goes (with its trimming record if it was `trimmed`), unless the
        model was pointed at it; then the oldest kept outputs go while there are more of them, or they take more
        room, than the budget."""
        if not kept:
            self._remove(dir_fd, name, trimmed)
            return
        self._names.append(name)
        sizes = [used(dir_fd, n) for n in self._names]   # (re-read: a process left behind may still append)
        total = sum(sizes)
        for size in sizes[:-1]:
            if total <= self.budget and len(self._names) <= self.files:
                break
            self._remove(dir_fd, self._names.popleft())
            total -= size

    def clear(self, dir_fd: int) -> None:
        """Remove every output file: the agent's processes are gone and its outputs with them (the patch gets the
        room)."""
        self._names.clear()
        self.close()
        with os.scandir(dir_fd) as entries:
            names = [entry.name for entry in entries if not entry.is_dir(follow_symlinks=False)]
        for name in names:
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass
