"""Trees deeper than Python's recursion limit, for the tests of pid's walks over a repository. Made here with a loop
over directory descriptors (os.makedirs recurses once per level, and a deep path may pass PATH_MAX); conftest's
`deep_tmp` removes them with pid.jobs.trees.remove_tree (shutil.rmtree, and so pytest's own clean-up, recurse too)."""
from __future__ import annotations

import os
from pathlib import Path

DEPTH = 1100   # past Python's default recursion limit (1,000)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make(root: Path, depth: int = DEPTH, name: str = "d", leaf: bytes = b"bottom\n") -> str:
    """`root`/top.txt, and `depth` directories `name` one in the other with leaf.txt at the bottom; the leaf's path
    relative to root."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "top.txt").write_text("top\n")
    fd = os.open(root, _DIR)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            below = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = below
        out = os.open("leaf.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd)
        os.write(out, leaf)
        os.close(out)
    finally:
        os.close(fd)
    return "/".join([name] * depth + ["leaf.txt"])

