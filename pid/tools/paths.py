"""Sandbox path resolution (pi's path rules) and the per-file lock that serialises edit/write calls.

pi's rules, applied to every tool's `path`: Unicode spaces become ASCII spaces, a leading `@` goes, `~` and `~/...`
name the agent's home, a `file://` URL names its path, and a relative path resolves against the working directory.
read alone also tries the names macOS gives screenshots when the path as written does not exist.
"""
from __future__ import annotations

import errno
import os
import posixpath
import re
import shlex
import threading
import unicodedata
import urllib.parse
import weakref
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

from pid.sandbox_api import OutputPolicy, RUN_ANYWHERE, Sandbox
from pid.tools.base import ToolContext, ToolResult

ABORTED = "Operation aborted"   # pi's text for a call cancelled before or while it ran

_UNICODE_SPACES = re.compile("[\u00a0\u2000-\u200a\u202f\u205f\u3000]")
_NARROW_NBSP = "\u202f"
_AM_PM = re.compile(r" (AM|PM)\.", re.IGNORECASE)


EMPTY_PATH = "The path is empty: name the file (relative to the working directory, or absolute)."


def display_path(path: str) -> str:
    """The path as the model wrote it, minus the `@` some models prefix (a habit from chat UIs)."""
    return path[1:] if path.startswith("@") else path


def normalize_path(path: str, home: Callable[[], str]) -> str:
    """pi's normalisation, in pi's order; `home` is asked only for a path that starts with `~`.

    Raises ValueError for a file URL that names no local path (pi's wording)."""
    path = _UNICODE_SPACES.sub(" ", path)
    path = display_path(path)
    if path == "~":
        return home()
    if path.startswith("~/"):
        return posixpath.join(home(), path[2:])
    if path.startswith("file://"):
        return file_url_path(path)
    return path


def file_url_path(url: str) -> str:
    """`file:///a/b%20c` -> `/a/b c`, as Node's fileURLToPath does it on Linux."""
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ValueError('File URL host must be "localhost" or empty on linux')
    if re.search("%2f", parts.path, re.IGNORECASE):
        raise ValueError("File URL path must not include encoded / characters")
    return urllib.parse.unquote(parts.path, errors="surrogateescape") or "/"


_homes: "weakref.WeakKeyDictionary[object, str]" = weakref.WeakKeyDictionary()
_homes_lock = threading.Lock()


def sandbox_home(sandbox: Sandbox) -> str:
    """The agent's home inside the sandbox ($HOME of its commands), asked once per sandbox."""
    try:
        with _homes_lock:
            known = _homes.get(sandbox)
    except TypeError:   # a sandbox object that cannot be weakly referenced: ask every time
        known = None
    if known:
        return known
    result = sandbox.exec(RUN_ANYWHERE + 'printf %s "$HOME"', timeout=30, output=OutputPolicy(tail_bytes=4096))
    home = result.tail.decode("utf-8", "surrogateescape")
    if result.exit_code != 0 or not home.startswith("/"):
        raise ValueError("Cannot expand ~: the sandbox did not say where the home directory is")
    try:
        with _homes_lock:
            _homes[sandbox] = home
    except TypeError:
        pass
    return home


def resolve_path(sandbox: Sandbox, path: str) -> str:
    """Absolute, normalised in-sandbox path; relative paths resolve against the sandbox's workdir."""
    path = normalize_path(path, lambda: sandbox_home(sandbox))
    return posixpath.normpath(posixpath.join(sandbox.workdir, path))


def read_path_variants(path: str) -> list[str]:
    """Names to try, in pi's order, when `path` does not exist: a narrow no-break space before AM/PM (macOS
    screenshots), NFD (macOS file names), a curly apostrophe, and NFD with the curly apostrophe."""
    nfd = unicodedata.normalize("NFD", path)
    candidates = [_AM_PM.sub(_NARROW_NBSP + r"\1.", path), nfd, path.replace("'", "\u2019"), nfd.replace("'", "\u2019")]
    out: list[str] = []
    for candidate in candidates:
        if candidate != path and candidate not in out:
            out.append(candidate)
    return out


T = TypeVar("T")


def with_read_fallback(path: str, attempt: Callable[[str], T]) -> tuple[str, T]:
    """attempt(path); if the file is not found, the first variant that exists. The original error otherwise."""
    try:
        return path, attempt(path)
    except FileNotFoundError as first:
        for variant in read_path_variants(path):
            try:
                return variant, attempt(variant)
            except (FileNotFoundError, NotADirectoryError):
                continue
        raise first


def real_path(ctx: ToolContext, path: str) -> str:
    """`path` with every symlink resolved inside the sandbox (missing tail components kept as written), so that two
    names of one file share a lock. The path itself when the sandbox cannot say."""
    if ctx.cancel.is_set():   # nothing is started only to be killed at once
        raise InterruptedError(errno.EINTR, ABORTED)
    result = ctx.sandbox.exec(f"{RUN_ANYWHERE}realpath -m -z -- {shlex.quote(path)}", timeout=30,
                              output=OutputPolicy(tail_bytes=65536), cancel=ctx.cancel)
    if result.cancelled:
        raise InterruptedError(errno.EINTR, ABORTED)
    real = result.tail[:-1] if result.tail.endswith(b"\0") else b""
    if result.exit_code != 0 or not real.startswith(b"/") or b"\0" in real:
        return path
    return os.fsdecode(real)


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
        text = ABORTED
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


@contextmanager
def mutation_lock(ctx: ToolContext, path: str) -> Iterator[None]:
    """Serialise edit and write calls on one file, whatever names (symlinks, `..`) they reach it by: pi's
    per-file mutation queue, keyed by the real path inside the sandbox."""
    with file_locks.hold(ctx.sandbox, real_path(ctx, path)):
        yield
