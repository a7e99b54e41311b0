"""Sandbox path resolution and the per-file lock that serialises edit/write calls within a batch."""
from __future__ import annotations

import posixpath
import threading
from contextlib import contextmanager
from typing import Iterator

from pid.sandbox import Sandbox


def display_path(path: str) -> str:
    """The path as the model wrote it, minus the `@` some models prefix (a habit from chat UIs)."""
    return path[1:] if path.startswith("@") else path


def resolve_path(sandbox: Sandbox, path: str) -> str:
    """Absolute, normalised in-sandbox path; relative paths resolve against the sandbox's workdir."""
    path = display_path(path)
    return posixpath.normpath(posixpath.join(sandbox.workdir, path))


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
