"""Sandbox path resolution and the per-file lock that serialises edit/write calls within a batch."""
from __future__ import annotations

import errno
import posixpath
import threading
from contextlib import contextmanager
from typing import Iterator

from pid.sandbox import Sandbox
from pid.tools.base import ToolResult


def display_path(path: str) -> str:
    """The path as the model wrote it, minus the `@` some models prefix (a habit from chat UIs)."""
    return path[1:] if path.startswith("@") else path


def resolve_path(sandbox: Sandbox, path: str) -> str:
    """Absolute, normalised in-sandbox path; relative paths resolve against the sandbox's workdir."""
    path = display_path(path)
    return posixpath.normpath(posixpath.join(sandbox.workdir, path))


def file_error(exc: OSError, shown: str, directory_hint: str = "") -> ToolResult:
    """One wording, whichever tool met it, for a path that cannot be read or written as a file."""
    if isinstance(exc, FileNotFoundError):
        text = f"File not found: {shown}"
    elif isinstance(exc, IsADirectoryError):
        text = f"{shown} is a directory, not a file.{directory_hint}"
    elif isinstance(exc, NotADirectoryError):
        text = f"A parent of {shown} is a file, not a directory."
    elif isinstance(exc, PermissionError):
        text = f"Permission denied: {shown}"
    elif isinstance(exc, TimeoutError):
        text = f"The sandbox did not answer in time for {shown}; try again."
    elif isinstance(exc, InterruptedError):
        text = f"Aborted: {shown}"
    elif exc.errno == errno.ENOSPC:
        text = f"No space left on device: {shown} (the job's disk limit was reached)."
    else:
        text = f"{shown} is not a regular file (a FIFO, socket or device). Use bash to work with it."
    return ToolResult.error(text)


class _PathLocks:
    """One lock per (sandbox, path); entries are dropped when nobody holds or waits for them."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[int, str], tuple[threading.Lock, int]] = {}

    @contextmanager
    def hold(self, sandbox: Sandbox, path: str) -> Iterator[None]:
        key = (id(sandbox), path)
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


file_locks = _PathLocks()
