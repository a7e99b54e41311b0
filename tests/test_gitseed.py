"""The base snapshot's blobs, pack and index as the unpacker writes them: git reads them as its own (fsck clean,
status clean, the same tree `git add -A` makes), for small, multi-block, streamed, empty and duplicate files and
links, written at once or deferred. Host git; no Docker."""
from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest

from pid.sandbox.gitseed import GitSeed
from pid.sandbox.workspace import pack_tar, unpack_tar

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "core.excludesFile=/dev/null"]


def tree(root: Path) -> Path:
    (root / "d" / "e").mkdir(parents=True)
    blobs = {"small.txt": b"small\n", "empty": b"", "d/multi.bin": os.urandom(200_000),
             "d/e/streamed.bin": os.urandom(3 << 20), "dup1": b"same\n", "d/dup2": b"same\n"}
    for name, data in blobs.items():
        (root / name).write_bytes(data)
    (root / "d" / "e" / "run.sh").write_text("#!/bin/sh\n")
    (root / "d" / "e" / "run.sh").chmod(0o755)
    os.symlink("d/multi.bin", root / "link")
    (root / ".gitignore").write_text("*.log\n")
    (root / "x.log").write_text("ignored\n")
    return root


@pytest.mark.parametrize("deferred", [False, True], ids=["at-once", "deferred"])
def test_git_takes_the_seed_as_its_own(tmp_path, deferred):
    src = tree(tmp_path / "src")
    data = io.BytesIO()
    pack_tar(str(src), data)
    work, git_dir = tmp_path / "work", tmp_path / "git"
    work.mkdir()
    (git_dir / "objects" / "pack").mkdir(parents=True)
    seed = GitSeed(str(git_dir), deferred=deferred)
    unpack_tar(io.BytesIO(data.getvalue()), str(work), os.getuid(), os.getgid(), seed)
    assert seed.unusable is None
    env = dict(os.environ, GIT_DIR=str(git_dir), GIT_WORK_TREE=str(work))
    run = lambda *args: subprocess.run([*GIT, *args], env=env, check=True, capture_output=True,  # noqa: E731
                                       text=True).stdout
    run("init", "-q", "-b", "main")
    ignored = run("ls-files", "-z", "-c", "-i", "--exclude-standard").split("\0")
    run("rm", "-q", "--cached", *[p for p in ignored if p])
    if deferred:
        assert run("count-objects", "-v").count("in-pack: 0") == 1   # nothing written yet...
        tree_id = run("write-tree", "--missing-ok").strip()
        seed.fill(io.BytesIO(data.getvalue()))                        # ...until the tar is read again
    else:
        tree_id = run("write-tree").strip()
    run("update-ref", "refs/heads/main", run("commit-tree", tree_id, "-m", "base").strip())
    assert run("fsck", "--no-dangling", "--no-progress") == ""
    assert run("status", "--porcelain") == ""                 # the index's stat data is the files' own
    objects = {line.split()[0]: line.split()[1] for line in run("count-objects", "-v").splitlines()}
    assert objects["count:"] == "4" and objects["packs:"] == "1"   # loose: 3 trees and the commit; blobs packed
    expected = subprocess.run(["sh", "-c", "git init -q . && git add -A && git write-tree"], cwd=src, check=True,
                              capture_output=True, text=True, env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null"}
                              ).stdout.strip()
    assert tree_id == expected
    for name in ("d/e/streamed.bin", "d/multi.bin", "empty", "dup1", "d/dup2", "link"):
        stored = subprocess.run([*GIT, "cat-file", "blob", f"{tree_id}:{name}"], env=env, check=True,
                                capture_output=True).stdout
        assert stored == (os.readlink(src / name).encode() if name == "link" else (src / name).read_bytes())
