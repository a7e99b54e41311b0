"""Trimming a running command's output file from the host, through the job disk.

A command may print far more than the job's disk holds; only its tail matters (the model sees the tail, the full
output file is a tail too past KEEP_OUTPUT). The host punches out the file's front (the command keeps appending to
the same file) and records what went in "<file>.cut": the bytes and the newlines cut, which the container's server
adds back when it counts the output (cutinfo in channel_ops.sh). Done on the host, it needs no process and no channel
in the container, and it works under gVisor, whose files refuse hole punching from inside.
"""
from __future__ import annotations

import ctypes
import errno
import os
import stat
import time
from typing import Callable

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
STEP = 1 << 20            # the front goes in whole mebibytes
READ_CHUNK = 1 << 20
COUNT_BUDGET_S = 1.0      # of host time per trim counting the newlines about to go; the rest waits for the next
FULL_BELOW = 1 << 20      # a disk counts as full with less left for the agent (pid's: a flood outran the trims)


def read_cut(dir_fd: int, name: str) -> tuple[int, int]:
    """(bytes, newlines) cut so far from output file `name` (0, 0 when none was)."""
    try:
        fd = _open_regular(dir_fd, name + ".cut", os.O_RDONLY)
    except FileNotFoundError:
        return 0, 0
    try:
        fields = os.read(fd, 64).split()
    finally:
        os.close(fd)
    if len(fields) != 2 or not all(f.isdigit() for f in fields):
        return 0, 0
    return int(fields[0]), int(fields[1])


def is_full(fd: int) -> bool:
    """Whether the disk of `fd` has no room left for the agent's writes (FULL_BELOW)."""
    st = os.fstatvfs(fd)
    return st.f_bavail * st.f_frsize < FULL_BELOW


def trim_front(dir_fd: int, name: str, keep: int, on_full: Callable[[], None] | None = None) -> int:
    """Leave about the last `keep` bytes of output file `name` on disk once more than twice that is kept; returns the
    bytes cut so far. Raises OSError when the file cannot be read or punched (the caller keeps what it has).
    `on_full()` is called when the disk was full before the cut (as it began, or as the newlines were counted): a
    flood outran the trims, and what came meanwhile was lost."""
    cut, lines = read_cut(dir_fd, name)
    fd = _open_regular(dir_fd, name, os.O_RDWR)   # (punching needs write access)
    try:
        if on_full is not None and is_full(fd):
            on_full()
        size = os.fstat(fd).st_size
        new = (size - keep) // STEP * STEP
        if size - cut <= 2 * keep or new <= cut:
            return cut
        found, new = _newlines(fd, cut, new, time.monotonic() + COUNT_BUDGET_S)   # before they go
        if new <= cut:
            return cut
        lines += found
        if on_full is not None and is_full(fd):
            on_full()
        if _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, cut, new - cut) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot punch the front of {name}: {os.strerror(err)}")
    finally:
        os.close(fd)
    _write_cut(dir_fd, name, new, lines)
    return new


def _newlines(fd: int, start: int, end: int, deadline: float) -> tuple[int, int]:
    """(newlines in [start, stop), stop): stop is `end`, or where `deadline` came. Only the file's data is read: a
    hole holds no newline, and the agent can make its output file terabytes long with nothing behind it (the host
    would read zeros for hours, its command's timeout unseen)."""
    lines, at = 0, start
    while at < end and time.monotonic() < deadline:
        try:
            data = os.lseek(fd, at, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            return lines, end   # (nothing but a hole from here)
        if data >= end:
            return lines, end
        hole = min(end, os.lseek(fd, data, os.SEEK_HOLE))
        at = data
        while at < hole and time.monotonic() < deadline:
            chunk = os.pread(fd, min(READ_CHUNK, hole - at), at)
            if not chunk:   # (cut shorter meanwhile)
                return lines, at
            lines += chunk.count(b"\n")
            at += len(chunk)
    return lines, min(at, end)


def count_output(dir_fd: int, name: str, tail_bytes: int) -> tuple[int, int, int, bytes] | None:
    """(newlines, bytes, bytes cut from its front, its last `tail_bytes`) of an ended command's output file `name`:
    what the server's `c` request answers, counted here with no process in the container (with a fork bomb's full
    process table, that request's `wc` waited on fork retries past every deadline). None when what is left after the
    cut takes longer than COUNT_BUDGET_S to count: the server counts it then. OSError when it cannot be read."""
    cut, lines = read_cut(dir_fd, name)
    fd = _open_regular(dir_fd, name, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        found, reached = _newlines(fd, min(cut, size), size, time.monotonic() + COUNT_BUDGET_S)
        if reached < size:
            return None
        start = max(0, size - tail_bytes)
        return lines + found, size, cut, os.pread(fd, size - start, start)
    finally:
        os.close(fd)


def read_tail(dir_fd: int, name: str, offset: int, max_bytes: int) -> tuple[int, bytes]:
    """(output file `name`'s size now, its bytes from `offset` on, at most the last `max_bytes` of them): what the
    server's `t` request answers, read here with no process in the container (a fork bomb's full process table made
    that request's `tail` and `head` wait on fork retries). OSError when the file cannot be read."""
    fd = _open_regular(dir_fd, name, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        start = max(min(offset, size), size - max_bytes)
        return size, os.pread(fd, size - start, start)
    finally:
        os.close(fd)


def _open_regular(dir_fd: int, name: str, mode: int) -> int:
    """A regular file of the job disk's output directory, never followed, never blocking (a root agent can put
    anything there)."""
    fd = os.open(name, mode | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{name} is not a regular file")
    return fd


def _write_cut(dir_fd: int, name: str, cut: int, lines: int) -> None:
    """The record, replaced whole (renamed over): the server never reads half of one. Written to a file made anew
    (what a root agent put at its name, a FIFO, a file it holds a lease on or a hard link, is unlinked first)."""
    temp = name + ".cut.new"
    try:
        os.unlink(temp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                 dir_fd=dir_fd)
    try:
        os.write(fd, b"%d %d\n" % (cut, lines))
    finally:
        os.close(fd)
    os.rename(temp, name + ".cut", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
