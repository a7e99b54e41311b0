"""The job's workspace in a container, and its changes out: where it comes from and what its base commit is.

Two kinds, one Protocol: an UploadedWorkspace is copied in (a host directory, a submitted tar, a git clone) and its
base recorded as it arrives; an ImageWorkspace is the task image's own workdir as the image has it (e.g. /testbed,
see image_fs.py): nothing is copied, and its base is recorded while the agent works, from pid's read-only view of
it. Either way the base lives in a repository of pid's own outside the workspace, and the patch is made from it by
pid's git, as root (workspace.py's scripts). Files cross the host boundary only as tar streams, built and extracted
without following links, bounded in size and validated name by name.
"""
from __future__ import annotations

import dataclasses
import os
import posixpath
import stat
import tarfile
import tempfile
import threading
from typing import IO, Callable, Protocol, cast

import docker.errors

from pid.config import pid_home
from pid.sandbox_lifecycle import FilesBudget, PatchCopy, Skipped
from pid.terminal import escaped

from .artifacts import copy_patch, extract_files, write_patch
from .errors import SandboxError
from .exec_channels import ExecChannels
from .gitseed import GitSeed
from .image_fs import BASE_TARGET
from .channel import PID_DIR
from .config import container_path
from .launch import Container
from .reaper import owner_label
from .workspace import UnsafeTar, WorkspaceTooLarge, base_script, build_tar, sanitize_tar, unpack_tar


class Workspace(Protocol):
    """The workspace's way in, and its base commit: the patch's "before"."""

    def import_workspace(self, host_path: str, timeout: float) -> None: ...
    def import_tar(self, stream: IO[bytes], timeout: float) -> None: ...
    def import_git(self, url: str, ref: str | None, timeout: float) -> str: ...
    def import_image(self, timeout: float) -> None: ...

    def base(self, timeout: float) -> str:
        """The base commit, all of it in pid's repository (what was written in the background waited for)."""
        ...

    def close(self) -> None:
        """Nothing of it writes on the job's disk any more (before the disk goes). Never raises."""
        ...

    def moved(self, container: Container, channels: ExecChannels) -> None:
        """The workspace is now seen through another container on the same disks (DockerSandbox._revive)."""
        ...


def workspace_for(container: Container, channels: ExecChannels, agent_started: Callable[[], bool]) -> Workspace:
    """The image's own workdir when the container has pid's view of it (a task image's job without a repository),
    else one to copy in."""
    image_fs = container.image_fs
    if image_fs is not None and image_fs.base is not None:
        return ImageWorkspace(channels)
    return UploadedWorkspace(container, channels, agent_started)


class UploadedWorkspace:
    """A workspace copied into the container's workdir (owned by the agent), its base recorded on the way."""

    def __init__(self, container: Container, channels: ExecChannels, agent_started: Callable[[], bool]) -> None:
        self.container = container
        self.channels = channels
        self.agent_started = agent_started
        self.base_commit: str | None = None
        self.early: IO[bytes] | None = None     # the workspace tar unpacked already, as the container started
        self._seeded = False                    # the import wrote the base's objects and index (see _record_base)
        self._seed: GitSeed | None = None       # a deferred seed, its tar spooled on the job disk, and its writer:
        self._spool: str | None = None          # the base's blobs are written after the base (see _record_base)
        self._packing: threading.Thread | None = None   # writes the base's blobs on the job disk from the host
        self._error: str | None = None          # why the base's background part failed

    def import_workspace(self, host_path: str, timeout: float) -> None:
        """Copy a host directory into workdir and record it as the base of the patch. The host directory is only
        read (never followed through links, never touched by git)."""
        config = self.container.config
        try:
            spool = build_tar(host_path, self.container.uid, self.container.gid, config.max_workspace)
        except WorkspaceTooLarge:
            raise SandboxError(f"{host_path} is larger than the workspace limit "
                               f"({config.max_workspace} bytes once packed)") from None
        with spool:
            self.unpack(spool, trusted=True)
        self._record_base(timeout)

    def import_tar(self, stream: IO[bytes], timeout: float) -> None:
        """Unpack a workspace tar read from `stream` (as `pid submit` packed it, on whatever machine: checked member
        by member, see workspace.MemberCheck) into workdir as it arrives, and record it as the base. If it was
        unpacked as the container started (`early`), only the base is left to record."""
        if stream is not self.early:
            self.unpack(stream, trusted=False)
        self.early = None
        self._record_base(timeout)

    def import_git(self, url: str, ref: str | None, timeout: float) -> str:
        """Clone `url` at `ref` into workdir, git running in a container of its own (pid.sandbox.clone), and record the
        checkout as the base; returns the commit cloned."""
        from .clone import clone_into
        box = self.container
        config = dataclasses.replace(box.config, owner=box.config.owner or owner_label(pid_home()))
        commit = clone_into(box.client, config, url, ref, lambda tar: self.unpack(tar, trusted=False), timeout)
        self._record_base(timeout)
        return commit

    def import_image(self, timeout: float) -> None:
        raise SandboxError("this sandbox's workspace is not the image's own directory")

    def unpack(self, stream: IO[bytes], trusted: bool) -> None:
        """A workspace tar into workdir. `trusted`: build_tar made it here (else every member is checked)."""
        box = self.container
        try:
            if box.disk is not None and not self.agent_started() and not os.listdir(box.disk.path("workspace")):
                self._unpack_on_disk(stream, box.disk.path("workspace"))
                return
            if trusted:
                ok = box.client.api.put_archive(box.id, box.config.workdir, stream)
            else:   # the engine unpacks as root in the container: it gets only what the checks let through
                with tempfile.TemporaryFile(prefix="pid-import-") as staged:
                    sanitize_tar(stream, staged, box.uid, box.gid)
                    staged.seek(0)
                    ok = box.client.api.put_archive(box.id, box.config.workdir, staged)
        except UnsafeTar as exc:
            raise SandboxError(f"the workspace archive was refused: {exc}") from exc
        except (OSError, tarfile.TarError, docker.errors.DockerException) as exc:
            raise SandboxError(f"cannot copy workspace into the sandbox: {exc}") from exc
        if not ok:
            raise SandboxError("cannot copy workspace into the sandbox")

    def _unpack_on_disk(self, stream: IO[bytes], target: str) -> None:
        """Straight into the job disk's workspace directory as the tar streams in: no engine request (put_archive
        re-executes the engine in the container, 130-250 ms here), no copy. Only before any agent command, into the
        empty directory: until then nothing in it is the agent's, so nothing there can redirect the host's writes.
        The base's git objects and index are written on the way (gitseed)."""
        uid, gid = self.container.uid, self.container.gid
        seed = self._new_seed()
        if seed is None or not seed.deferred:
            unpack_tar(stream, target, uid, gid, seed)
            self._seeded = seed is not None and seed.unusable is None
            return
        spool = os.path.join(seed.git_dir, "pid-workspace.tar")   # the tar again, for the deferred pack
        with open(spool, "xb", buffering=1 << 20) as copy:
            unpack_tar(cast(IO[bytes], _Tee(stream, copy)), target, uid, gid, seed)
        if seed.unusable is None:
            self._seeded, self._seed, self._spool = True, seed, spool
        else:
            os.unlink(spool)

    def _new_seed(self) -> GitSeed | None:
        """pid's repository-to-be on the job disk (/.pid/git, root only; made empty with the disk), for the
        unpacker to write the base's objects and index into; None if something is in it already (a second import:
        git makes that base)."""
        disk = self.container.disk
        assert disk is not None
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        fds = [os.open(disk.path("pid"), flags)]
        try:
            try:
                os.mkdir("git", 0o700, dir_fd=fds[-1])
            except FileExistsError:
                pass
            fds.append(os.open("git", flags, dir_fd=fds[-1]))
            if os.listdir(fds[-1]):
                return None
            for name in ("objects", "pack"):
                os.mkdir(name, 0o700, dir_fd=fds[-1])
                fds.append(os.open(name, flags, dir_fd=fds[-1]))
        finally:
            for fd in fds:
                os.close(fd)
        # Deferred (blobs written while the agent runs) only when the agent cannot reach /.pid/git: the host then
        # writes there by path. A root agent could plant links there, so its base is written whole before it starts.
        return GitSeed(os.path.join(disk.path("pid"), "git"), deferred=self.container.uid != 0)

    def _record_base(self, timeout: float) -> None:
        seeded, self._seeded = self._seeded, False
        deferred = seeded and self._seed is not None
        self.base_commit = _commit(self.channels.run_as_pid(
            base_script(self.container.config.workdir, seeded, deferred), "recording the base commit", timeout))
        if deferred:   # its blobs, from the spooled tar, while the model reads the first request
            self._packing = threading.Thread(target=self._fill_pack, name="pid-base-pack", daemon=True)
            self._packing.start()

    def _fill_pack(self) -> None:
        seed, spool = self._seed, self._spool
        assert seed is not None and spool is not None
        try:
            with open(spool, "rb") as f:
                seed.fill(f)
        except BaseException as exc:
            self._error = f"cannot write the base commit's objects: {exc}"
            seed.discard()
        finally:
            try:
                os.unlink(spool)
            except OSError:
                pass

    def wait_for_base(self) -> None:
        """The base's blobs are all in pid's repository (the deferred pack is written)."""
        if self._packing is not None:
            self._packing.join()
        self._packing = None
        if self._error is not None:
            raise SandboxError(self._error)

    def base(self, timeout: float) -> str:
        self.wait_for_base()
        if self.base_commit is None:
            raise SandboxError("no base commit: import_workspace was not called")
        return self.base_commit

    def moved(self, container: Container, channels: ExecChannels) -> None:
        self.container, self.channels = container, channels

    def close(self) -> None:
        if self._packing is not None:   # it writes on the job disk: done (a second or so) before the disk goes
            self._packing.join(30.0)


class ImageWorkspace:
    """The image's own workdir, as it is: nothing to copy. Its base is recorded while the agent works, from pid's
    read-only view of it (BASE_TARGET: the image's layers never change, whatever the agent does)."""

    def __init__(self, channels: ExecChannels) -> None:
        self.channels = channels
        self.base_commit: str | None = None
        self._recording: threading.Thread | None = None   # records the base in the container (import_image)
        self._error: str | None = None

    def import_workspace(self, host_path: str, timeout: float) -> None:
        raise _nothing_imported()

    def import_tar(self, stream: IO[bytes], timeout: float) -> None:
        raise _nothing_imported()

    def import_git(self, url: str, ref: str | None, timeout: float) -> str:
        raise _nothing_imported()

    def import_image(self, timeout: float) -> None:
        # (what would make the recording fail later, said before the model is paid for)
        self.channels.run_as_pid("command -v git >/dev/null || { echo 'the image has no git, which pid needs to make "
                                 "the patch'; exit 1; }", "looking for git", timeout)

        def record() -> None:
            try:
                self.base_commit = self._record(self.channels.run_as_pid_aside, timeout)
            except BaseException as exc:
                self._error = f"cannot record the base commit: {exc}"
        self._recording = threading.Thread(target=record, name="pid-image-base", daemon=True)
        self._recording.start()

    @staticmethod
    def _record(run: Callable[[str, str, float], bytes], timeout: float) -> str:
        """The base commit, from pid's read-only view of the workdir, run by `run` (a run_as_pid)."""
        return _commit(run(base_script(BASE_TARGET), "recording the base commit", timeout))

    def base(self, timeout: float) -> str:
        """The base recorded while the agent worked; recorded again now if that met a disk the agent filled (from
        the same untouched view, into the room export_patch freed: see launch._reserve)."""
        if self._recording is not None:
            self._recording.join()
        self._recording = None
        if self._error is not None:   # (kept until it is recorded: a container found gone may be revived for it)
            self.base_commit = self._record(self.channels.run_as_pid, timeout)
            self._error = None
        if self.base_commit is None:
            raise SandboxError("no base commit: import_workspace was not called")
        return self.base_commit

    def close(self) -> None:
        pass

    def moved(self, container: Container, channels: ExecChannels) -> None:
        self.channels = channels


def copy_patch_out(container: Container, room: str, dest: str, max_bytes: int) -> PatchCopy:
    """The patch pid's git wrote as `room`/patch.diff, to host file `dest` (paths validated, size capped:
    artifacts.py). Under runc it is read where it lies, on pid's disk (read_patch); else through the engine."""
    if container.host_kernel and container.pid_disk is not None:
        assert room == f"{PID_DIR}/patch", room   # (pid's disk's "patch", bound there: launch.PID_DISK_DIRS)
        return read_patch(container.pid_disk.path("patch"), dest, max_bytes)
    inside = f"{room}/patch.diff"
    try:
        chunks, _ = container.client.api.get_archive(container.id, inside)
        try:
            return copy_patch(chunks, dest, max_bytes)
        finally:
            chunks.close()
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot copy the patch out of the sandbox: {exc}") from exc


def read_patch(host_dir: str, dest: str, max_bytes: int) -> PatchCopy:
    """The patch from host directory `host_dir` (pid's disk's, root's, 0700), to `dest`. Why not the engine's
    archive: that runs a `docker-tar` process per job (~30 ms of CPU) and a copy through the engine. The agent cannot
    write there unless it is root, and its processes were all killed before pid's git wrote the file: still, neither
    the directory nor the file is taken through a link, and only a regular file is read (a FIFO would not block)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dir_fd = os.open(host_dir, flags | os.O_DIRECTORY)
        try:
            fd = os.open("patch.diff", flags | os.O_NONBLOCK, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise SandboxError(f"cannot read the patch on pid's disk: {exc}") from exc
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SandboxError("cannot read the patch on pid's disk: it is no regular file")
        return write_patch(source, dest, max_bytes)   # (its own errors as the engine's way has them)


def export_files(container: Container, paths: list[str], dest_dir: str,
                 budget: FilesBudget) -> tuple[list[str], list[Skipped]]:
    """Copy in-container files or directories (absolute paths) into `dest_dir`, under their in-container paths;
    (host paths written, what was skipped and why). Limits and name checks: pid.sandbox.artifacts."""
    os.makedirs(dest_dir, exist_ok=True)
    written: list[str] = []
    skipped: list[Skipped] = []
    for path, inside in _outermost(paths, container.config.workdir):
        if inside == "/":
            skipped.append(Skipped(escaped(path), "the whole filesystem: name the directories to collect"))
            continue
        try:
            chunks, _ = container.client.api.get_archive(container.id, inside)
        except docker.errors.NotFound:
            pattern = any(mark in path for mark in "*?[")
            skipped.append(Skipped(path, "not found (a path, not a pattern: name the directory)" if pattern
                                   else "not found"))
            continue
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot copy {path} out of the sandbox: {exc}") from exc
        # Keep the in-container path under dest_dir (files/workspace/a/out.txt) so equal names never collide.
        parent = posixpath.dirname(posixpath.normpath(inside)).lstrip("/")
        target = os.path.join(dest_dir, parent) if parent else dest_dir
        os.makedirs(target, exist_ok=True)
        try:
            copied = extract_files(chunks, target, max_bytes=budget.max_bytes, max_entries=budget.max_entries,
                                   budget=budget)
        finally:
            chunks.close()
        if not copied.written:
            _remove_empty(target, dest_dir)   # (no files/etc left behind for a --file that was refused)
        written.extend(copied.written)
        # named as asked for (`/tmp/x.log`, not `x.log`: the archive names them from the last component on; below
        # `.` or `..`, from the directory it stands for)
        asked = posixpath.normpath(path)
        where = escaped(posixpath.dirname(inside if posixpath.basename(asked) in (".", "..") else asked))
        skipped.extend(s if s.path in ("…", "(archive)") or not where else
                       dataclasses.replace(s, path=posixpath.join(where, s.path)) for s in copied.skipped)
    return written, skipped


def _outermost(paths: list[str], workdir: str) -> list[tuple[str, str]]:
    """(the path as asked, as the container names it: absolute, cleaned as the engine cleans it) for each path that
    no other one holds, once. The engine's archive of a directory holds everything below it: `--file d` with
    `--file d/sub`, or `--file .` with `--file a.py`, copied a file twice (the second time refused, as there already),
    and `.` came without the workdir's own name (`files/a.py`, not `files/workspace/a.py`)."""
    named: dict[str, str] = {}
    for path in paths:
        named.setdefault(container_path(path, workdir), path)
    held = [inside for inside in named if inside != "/"]   # (`/` is refused: see export_files)
    return [(path, inside) for inside, path in named.items()
            if not any(inside.startswith(other + "/") for other in held)]


def _remove_empty(path: str, top: str) -> None:
    """Remove `path` and its parents below `top` while they are empty directories (pid made them)."""
    while os.path.normpath(path) != os.path.normpath(top):
        try:
            os.rmdir(path)
        except OSError:   # (not empty: another --file's, or not there)
            return
        path = os.path.dirname(path)


def _nothing_imported() -> SandboxError:
    return SandboxError("this sandbox's workspace is the image's own directory: nothing is imported into it")


def _commit(out: bytes) -> str:
    """The commit id a base script prints last."""
    return out.strip().splitlines()[-1].decode()


class _Tee:
    """A readable stream that copies what is read from it to `copy`."""

    def __init__(self, stream: IO[bytes], copy: IO[bytes]) -> None:
        self.stream, self.copy = stream, copy

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n)
        self.copy.write(data)
        return data
