"""What a job's workspace is: a tree packed at submit (a blob), a git URL cloned on the worker, or a directory read
when the job starts (`pid run`). The submit side packs and stores; the worker side imports (import_into).

Packing at submit is what lets a job run on another machine, and makes it see the tree as it was when it was
submitted, whatever happens to the directory afterwards. A `pid run` packs its directory as it starts (DirSnapshot):
the sandbox imports that tar, its check imports the same, and the job store keeps it as a blob, as it keeps a
submitted job's, so that `retry` and `continue` run on the very tree the job saw.
"""
from __future__ import annotations

import errno
import logging
import tempfile
import threading
from dataclasses import dataclass
from typing import IO, Any, BinaryIO

from pid.sandbox_api import BadWorkspace, SandboxError
from pid.sandbox_lifecycle import JobSandbox
from pid.sandbox.workspace import Packed, WorkspaceTooLarge, check_git_source, pack_error, pack_tar
from pid.jobs.blobs import BlobMissing, Blobs, default_blobs

log = logging.getLogger("pid.worker")


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
    """Pack the directory `root` (pid.sandbox.workspace.pack_tar: deterministic, links kept as links) into an anonymous
    temporary file (nothing is left behind if the process is killed), hashing as it is written, and store it unless a
    blob of that digest is already there. Raises WorkspaceTooLarge past `max_bytes` (0: no limit), OSError when the
    tree cannot be read."""
    with tempfile.TemporaryFile(prefix=".pid-pack-", dir=tmp_dir) as out:
        packed = pack_tar(root, out, 0, 0, max_bytes)
        out.flush()
        if not blobs.has(packed.digest):
            blobs.put_file(_name_of(out), packed.digest)
        return packed


def _name_of(file: IO[bytes]) -> str:
    """A name that opens the unlinked `file` again, as a reader of its own (its own offset), as a path would."""
    return f"/proc/self/fd/{file.fileno()}"


# What fails for the machine's sake, not the tree's (the snapshot's own file, the process's descriptors)
HOST_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EMFILE, errno.ENFILE, errno.ENOMEM}


class DirSnapshot:
    """A directory as its `pid run` job saw it: the tar its sandbox imports, in an anonymous temporary file (unlinked
    from its creation: a `pid run` killed with SIGKILL leaves no workspace-sized file behind) until close().
    keep() stores it as a blob in a thread of its own: the model's first request never waits for the store."""

    def __init__(self, root: str, max_bytes: int) -> None:
        self._file = tempfile.TemporaryFile(prefix="pid-snapshot-")
        try:
            self.packed: Packed = pack_tar(root, self._file, 0, 0, max_bytes)
            self._file.flush()
        except BaseException as exc:
            self._file.close()
            if isinstance(exc, WorkspaceTooLarge):
                raise SandboxError(f"{root} is larger than the workspace limit ({max_bytes} bytes once packed)"
                                   ) from None
            if isinstance(exc, OSError) and exc.errno not in HOST_ERRNOS:   # (no retry would read it better)
                raise BadWorkspace(f"cannot pack --repo {root}: {pack_error(exc)}") from None
            raise
        self.kept = False
        self._keeping: threading.Thread | None = None

    def open(self) -> BinaryIO:
        """A reader of its own (the check and the store may read it at the same time); ValueError once closed."""
        return open(_name_of(self._file), "rb")

    def keep(self, blobs: Blobs) -> None:
        """Store the snapshot in `blobs`, in the background (close() waits for it), once however often asked; a
        failure is logged, never raised: it costs `retry` and `continue`, not the job."""
        if self._keeping is not None:
            return

        def store() -> None:
            try:
                if not blobs.has(self.packed.digest):
                    blobs.put_file(_name_of(self._file), self.packed.digest)
                self.kept = True
            except Exception as exc:
                log.warning("the workspace snapshot was not kept in the job store (%s): retry and continue will not "
                            "find it", exc)
        self._keeping = threading.Thread(target=store, name="pid-keep-snapshot", daemon=True)
        self._keeping.start()

    def close(self) -> None:
        """Once stored (if it is being), the temporary file goes."""
        if self._keeping is not None:
            self._keeping.join()
        self._file.close()


def open_packed(workspace: str, blobs: Blobs | None = None) -> BinaryIO:
    """The workspace tar packed at submit, as a stream from the blob store (the caller closes it)."""
    try:
        return (blobs or default_blobs()).open(workspace)
    except BlobMissing as exc:
        raise BlobMissing(f"the workspace packed at submit is not in the blob store ({exc})") from None


def import_into(sandbox: JobSandbox, repo: str | None, workspace: str | None, blobs: Blobs | None = None,
                packed: BinaryIO | None = None, snapshot: DirSnapshot | None = None) -> dict[str, Any]:
    """Put the job's workspace into its sandbox and say which snapshot it is (result.json's `workspace`).
    `packed`: the workspace's stream, opened already (open_packed) and given to the sandbox as it was created.
    `snapshot`: a directory repo, packed already (DirSnapshot). No repo: the workspace is the image's own directory,
    already there."""
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
    if snapshot is None:
        sandbox.import_workspace(repo)
        return {"kind": "dir", "path": repo}
    with snapshot.open() as stream:
        sandbox.import_tar(stream)
    return {"kind": "dir", "path": repo, "digest": snapshot.packed.digest}


def is_directory_repo(repo: str | None, workspace: str | None) -> bool:
    """The job reads a directory when it starts (`pid run`): not packed at submit, not a git URL, not the image's."""
    return bool(repo) and not workspace and git_source(repo or "") is None
