"""The directories pid writes artifacts to (--out and each job's directory in it, a batch's directory, a download's,
PID_HOME) carry a marker file. A workspace packed from a directory leaves out every directory below it that holds the
marker: with `--repo .` and the default `--out ./pid-runs`, the agent would otherwise read the earlier jobs'
transcripts and patches (an evaluation's answers among them), and the workspace would grow with every run.
"""
from __future__ import annotations

import os

MARK = ".pid-output"
_TEXT = b"pid's output (artifacts, transcripts, patches): pid leaves this directory out of the workspaces it packs.\n"


def mark(directory: str) -> None:
    """Put the marker in `directory` (which exists). Best effort: where it cannot be written, nor can the artifacts."""
    try:
        fd = os.open(os.path.join(directory, MARK), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except OSError:
        return   # (there already, or not writable)
    try:
        os.write(fd, _TEXT)
    except OSError:
        pass
    finally:
        os.close(fd)


def make_marked(directory: str, mode: int = 0o777) -> None:
    """os.makedirs(directory, mode, exist_ok=True), marked; OSError as makedirs raises it."""
    os.makedirs(directory, mode=mode, exist_ok=True)
    mark(directory)


def is_marked(name: str, dir_fd: int | None = None) -> bool:
    """Whether the directory `name` (relative to `dir_fd`, if given) holds the marker."""
    try:
        os.stat(os.path.join(name, MARK), dir_fd=dir_fd, follow_symlinks=False)
        return True
    except OSError:
        return False
