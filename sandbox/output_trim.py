"""Trimming a running command's output file from the host, through the job disk.

A command may print far more than the job's disk holds; only its tail matters (the model sees the tail, the full
output file is a tail too past KEEP_OUTPUT). The host punches out the file's front (the command keeps appending to
the same file) and records what went in "<file>.cut": the bytes and the newlines cut, which the container's server
adds back when it counts the output (pid_cutinfo in channel.sh). Done on the host, it needs no process and no channel
in the container, and it works under gVisor, whose files refuse hole punching from inside.
"""
from __future__ import annotations

import ctypes
import os
import stat

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
STEP = 1 << 20            # the front goes in whole mebibytes
READ_CHUNK = 1 << 20


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


def trim_front(dir_fd: int, name: str, keep: int) -> int:
    """Leave about the last `keep` bytes of output file `name` on disk once more than twice that is kept; returns the
    bytes cut so far. Raises OSError when the file cannot be read or punched (the caller keeps what it has)."""
    cut, lines = read_cut(dir_fd, name)
    fd = _open_regular(dir_fd, name, os.O_RDWR)   # (punching needs write access)
    try:
        size = os.fstat(fd).st_size
        new = (size - keep) // STEP * STEP
        if size - cut <= 2 * keep or new <= cut:
            return cut
        for offset in range(cut, new, READ_CHUNK):   # the newlines about to go, counted before they do
            lines += os.pread(fd, min(READ_CHUNK, new - offset), offset).count(b"\n")
        if _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, cut, new - cut) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot punch the front of {name}: {os.strerror(err)}")
    finally:
        os.close(fd)
    _write_cut(dir_fd, name, new, lines)
    return new


def _open_regular(dir_fd: int, name: str, mode: int) -> int:
    """A regular file of the job disk's output directory, never followed, never blocking (a root agent can put
    anything there)."""
    fd = os.open(name, mode | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{name} is not a regular file")
    return fd


def _write_cut(dir_fd: int, name: str, cut: int, lines: int) -> None:
    """The record, replaced whole (renamed over): the server never reads half of one."""
    temp = name + ".cut.new"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        os.write(fd, b"%d %d\n" % (cut, lines))
    finally:
        os.close(fd)
    os.rename(temp, name + ".cut", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
