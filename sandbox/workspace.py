"""Moving files between host and container without the host ever interpreting them.

Host side rules: never follow a symlink, never run git, never write outside the destination. Tar streams go
through temporary files or are read incrementally, so memory stays small whatever the size of a repository.
"""
from __future__ import annotations

import io
import os
import stat
import tarfile
import tempfile
from typing import IO, Iterable, Iterator

# Base commit and patch are made by git inside the container; hooks, pagers, external diff drivers and
# textconv are disabled, and the user-level config is ignored so a changed ~/.gitconfig cannot alter the patch.
GIT = ("GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 git -c core.hooksPath=/dev/null "
       "-c commit.gpgsign=false -c core.fsmonitor=false -c user.name=pid -c user.email=pid@localhost")

BASE_SCRIPT = f"""set -e
# A .git *file* (a worktree or submodule) points at a repository that was not copied in: start a fresh one.
[ -d .git ] || {{ rm -f .git; {GIT} -c init.defaultBranch=main init -q; }}
{GIT} add -A
{GIT} commit -q --no-verify --allow-empty -m 'pid: base (workspace as imported)'
{GIT} rev-parse HEAD
"""

PATCH_SCRIPT = f"""set -e
{GIT} add -A
{GIT} -c diff.noprefix=false -c diff.mnemonicPrefix=false diff --cached --binary --no-color --no-ext-diff \\
  --no-textconv --no-renames --src-prefix=a/ --dst-prefix=b/ {{base}} -- > {{dest}}
"""


def build_tar(root: str) -> IO[bytes]:
    """A tar of the directory `root` in a temporary file (rewound): links stored as links, special files skipped.

    Regular files are opened with O_NOFOLLOW, so a file swapped for a symlink meanwhile is never followed.
    """
    root = os.path.abspath(root)
    if not os.path.isdir(root) or os.path.islink(root):
        raise NotADirectoryError(f"not a directory: {root}")
    spool = tempfile.TemporaryFile(prefix="pid-import-")
    with tarfile.open(fileobj=spool, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                _add(tar, os.path.join(dirpath, name), os.path.relpath(os.path.join(dirpath, name), root))
    spool.seek(0)
    return spool


def _owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _add(tar: tarfile.TarFile, path: str, arcname: str) -> None:
    st = os.lstat(path)
    if stat.S_ISREG(st.st_mode):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            return  # vanished or swapped for a link since the walk: skip it
        with os.fdopen(fd, "rb") as fileobj:
            info = tar.gettarinfo(arcname=arcname, fileobj=fileobj)
            if info.isreg() or info.islnk():
                tar.addfile(_owned_by_root(info), fileobj if info.isreg() else None)
    elif stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode):
        tar.addfile(_owned_by_root(tar.gettarinfo(path, arcname=arcname)))
    # sockets, FIFOs and devices are not part of a workspace


class ChunkStream(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (docker's get_archive stream)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def copy_single_member(chunks: Iterable[bytes], dest: str) -> int:
    """Write the one regular file of a tar stream to `dest`; returns its size."""
    with tarfile.open(fileobj=io.BufferedReader(ChunkStream(chunks), 1 << 20), mode="r|") as tar:
        for member in tar:
            if not member.isreg():
                continue
            source = tar.extractfile(member)
            size = 0
            with open(dest, "wb") as out:
                while block := source.read(1 << 20):
                    out.write(block)
                    size += len(block)
            return size
    raise FileNotFoundError("no regular file in the archive")


def extract_safely(chunks: Iterable[bytes], dest_dir: str) -> list[str]:
    """Extract a tar stream under `dest_dir` with the "data" filter; unsafe members are skipped.

    The filter refuses absolute names, `..`, links that point outside `dest_dir` (or anywhere absolute),
    device files and set-uid bits. Returns the host paths written.
    """
    written: list[str] = []

    def keep_safe(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        try:
            safe = tarfile.data_filter(member, path)
        except tarfile.FilterError:
            return None
        written.append(os.path.join(path, safe.name))
        return safe

    with tarfile.open(fileobj=io.BufferedReader(ChunkStream(chunks), 1 << 20), mode="r|") as tar:
        tar.extractall(dest_dir, filter=keep_safe)
    return written
