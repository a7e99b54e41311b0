"""What a job's workspace is: a tree packed at submit (a blob), a git URL cloned on the worker, or a directory read
when the job starts (`pid run`). The submit side packs and stores; the worker side imports (import_into).

Packing at submit is what lets a job run on another machine, and makes it see the tree as it was when it was
submitted, whatever happens to the directory afterwards.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, BinaryIO

from pid.sandbox_lifecycle import JobSandbox
from sandbox.workspace import Packed, check_git_source, pack_tar
from worker.blobs import BlobMissing, Blobs, default_blobs


@dataclass
class GitSource:
    url: str
    ref: str | None   # branch, tag or commit id; None: the default branch


def git_source(repo: str) -> GitSource | None:
    """`repo` as a git URL (scheme://…, optionally #REF), or None when it is a path. ValueError for a URL pid does
    not clone (an unknown scheme, a bad ref)."""
    if "://" not in repo:
        return None
    url, _, ref = repo.partition("#")
    check_git_source(url, ref or None)
    return GitSource(url, ref or None)


def pack_and_store(root: str, blobs: Blobs, max_bytes: int, tmp_dir: str | None = None) -> Packed:
    """Pack the directory `root` (sandbox.workspace.pack_tar: deterministic, links kept as links) into a temporary
    file, hashing as it is written, and store it unless a blob of that digest is already there. Raises
    WorkspaceTooLarge past `max_bytes` (0: no limit), OSError when the tree cannot be read."""
    fd, tmp = tempfile.mkstemp(prefix=".pid-pack-", dir=tmp_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            packed = pack_tar(root, out, 0, 0, max_bytes)
        if not blobs.has(packed.digest):
            blobs.put_file(tmp, packed.digest)
        return packed
    finally:
        os.unlink(tmp)


def open_packed(workspace: str, blobs: Blobs | None = None) -> BinaryIO:
    """The workspace tar packed at submit, as a stream from the blob store (the caller closes it)."""
    try:
        return (blobs or default_blobs()).open(workspace)
    except BlobMissing as exc:
        raise BlobMissing(f"the workspace packed at submit is not in the blob store ({exc})") from None


def import_into(sandbox: JobSandbox, repo: str | None, workspace: str | None, blobs: Blobs | None = None,
                packed: BinaryIO | None = None) -> dict[str, Any]:
    """Put the job's workspace into its sandbox and say which snapshot it is (result.json's `workspace`).
    `packed`: the workspace's stream, opened already (open_packed) and given to the sandbox as it was created.
    No repo: the workspace is the image's own directory, already there."""
    if not repo:
        sandbox.import_image()
        return {"kind": "image", "path": sandbox.workdir}
    if workspace:
        with packed or open_packed(workspace, blobs) as stream:
            sandbox.import_tar(stream)
        return {"kind": "tar", "digest": workspace}
    git = git_source(repo)
    if git is not None:
        commit = sandbox.import_git(git.url, git.ref)
        return {"kind": "git", "url": git.url, "ref": git.ref, "commit": commit}
    sandbox.import_workspace(repo)
    return {"kind": "dir", "path": repo}
