"""Removing a host directory tree the agent shaped (a job's --file artifacts), whatever its depth.

Why not shutil.rmtree: on Python 3.11 it recurses once per level, so a tree deeper than the recursion limit (a
repository 1,100 directories deep, collected with `--file`) raised RecursionError, which `ignore_errors` does not
cover. This walks the tree in a loop, one directory descriptor open at a time, and never follows a link.
"""
from __future__ import annotations

import os

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str) -> None:
    """As shutil.rmtree(path, ignore_errors=True): what cannot be removed stays, quietly. A link is removed, never
    followed; a directory moved away while it is walked ends the walk (nothing outside `path` is touched)."""
    try:
        fd = os.open(path, _DIR)
    except OSError:
        return
    names: list[str] = []                  # the directories descended into, from path
    parents: list[tuple[int, int]] = []    # each one's parent, as (device, inode)
    stuck: set[tuple[int, int]] = set()    # directories that could not be opened or removed: passed over
    try:
        while True:
            below = _first_subdir(fd, stuck)
            if below is not None:
                try:
                    child = os.open(below[0], _DIR, dir_fd=fd)
                except OSError:
                    stuck.add(below[1])
                    continue
                here = os.fstat(fd)
                parents.append((here.st_dev, here.st_ino))
                names.append(below[0])
                os.close(fd)
                fd = child
                continue
            if not names:
                break
            done = os.fstat(fd)
            parent = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = parent
            here = os.fstat(fd)
            if (here.st_dev, here.st_ino) != parents.pop():
                return   # (moved meanwhile: its ".." is elsewhere now)
            try:
                os.rmdir(names.pop(), dir_fd=fd)
            except OSError:
                stuck.add((done.st_dev, done.st_ino))
    except OSError:
        return
    finally:
        os.close(fd)
    try:
        os.rmdir(path)
    except OSError:
        pass


def _first_subdir(fd: int, stuck: set[tuple[int, int]]) -> tuple[str, tuple[int, int]] | None:
    """Unlink the directory's files and links until a subdirectory comes up; (its name, (device, inode)) or None."""
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    if not entry.is_dir(follow_symlinks=False):
                        os.unlink(entry.name, dir_fd=fd)
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) not in stuck:
                    return entry.name, (st.st_dev, st.st_ino)
    except OSError:
        pass
    return None
