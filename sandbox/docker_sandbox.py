"""`pid.sandbox_lifecycle.JobSandbox` on Docker: one hardened, labelled, self-expiring container per job.

DockerSandbox only composes the parts, each with one job:
  launch.py         the container: disks, hardening, limits, labels, time to live; its start and removal
  exec_channels.py  the pool of exec channels into it, and pid's own control channel (root)
  process_table.py  room in its process table, kills of process groups, clearing a full table
  commands.py       the agent's commands, reads and writes on those channels, and their output files
  workspaces.py     the workspace in (uploaded, or the image's own) and the patch and files out
Everything the job can write lives on a per-job filesystem of a fixed size; the image's own filesystem is read-only,
but for the trees a task image's job may change (`--workdir`: image_fs.py). pid's own files that the agent's work
must not starve are on a second filesystem, pid's own (launch.PID_DISK). The engine's errors are SandboxError by the
time they leave here (docker_client.engine_errors).
"""
from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import shlex
import threading
from typing import IO, Callable, Iterator, Sequence, TypeVar

import docker

from pid.sandbox_api import DEFAULT_OUTPUT, ExecResult, OutputPolicy, SandboxError
from pid.sandbox_lifecycle import FilesBudget, PatchCopy, Skipped
from pid.terminal import escaped

from .channel import PID_DIR, install_script
from .commands import FILE_TIMEOUT_S, Commands
from .config import SandboxConfig
from .docker_client import engine_errors
from .exec_channels import ExecChannels
from .disk import reap_disks
from .launch import Container, default_disk_root, free_reserve, launch, launch_on_disks_of, take_disks
from .memory import OUT_OF_MEMORY_EARLIER
from .process_table import ProcessTable
from .reaper import remove_job_containers
from .workspace import NESTED_WHY, patch_script, unrecorded
from .workspaces import UploadedWorkspace, copy_patch_out, export_files, workspace_for

log = logging.getLogger(__name__)
T = TypeVar("T")


class DockerSandbox:
    """Implements pid.sandbox_lifecycle.JobSandbox (and so pid.sandbox_api.Sandbox) by delegating to its parts.
    Thread-safe: concurrent calls use separate channels."""

    def __init__(self, container: Container) -> None:
        self.container = container   # its engine client, id, config, uid and gid: one place, not mirrored here
        self.workdir = container.config.workdir
        self.image_id = container.image_id   # the image it runs, by id (result.json says which)
        self.channels = ExecChannels(container)
        self.processes = ProcessTable(container, self.channels)
        self.commands = Commands(container, self.channels, self.processes)
        self.workspace = workspace_for(container, self.channels, lambda: self.commands.agent_started)
        self._unpacked: BaseException | None = None   # why the workspace unpacked as it started failed
        self._closed = False
        self._revived = False   # a fresh container on the disks took the gone one's place (_revive)
        self._killed = False    # kill() was called: the sandbox is gone on purpose
        self._swapping = threading.Lock()   # (kill() and a revival's swap of the container)

    @property
    def removed_by_pid(self) -> bool:
        return self._killed or self.container.removed_by_pid

    # -- lifecycle ------------------------------------------------------------------------------------------
    @classmethod
    @engine_errors
    def create(cls, config: SandboxConfig, client: docker.DockerClient | None = None,
               workspace: IO[bytes] | None = None) -> "DockerSandbox":
        """Start the container and its control channel; two agent channels warm up in the background.

        `workspace`: a workspace tar to unpack onto the job's disk while the engine starts the container (the
        engine's ~0.5 s and the unpacking overlap); import_tar(workspace) then only records the base. Without a
        job disk it is left for import_tar.

        Raises ImageNotFound / DockerUnavailable / SandboxError (also for a disk limit that cannot be applied, or
        a workspace tar that is refused).
        """
        container = launch(config, client)
        try:
            sandbox = cls(container)
        except BaseException:
            container.remove()
            container.release()
            raise
        unpacking: threading.Thread | None = None
        try:
            if container.disk is not None:
                install_script(container.client.api, container.id, container.disk.path("pid"))
                if workspace is not None and isinstance(sandbox.workspace, UploadedWorkspace):
                    unpacking = sandbox._unpack_early(sandbox.workspace, workspace)
            container.start()
            if container.disk is None:
                install_script(container.client.api, container.id, None)
            sandbox.processes.events = sandbox.channels.start_control()
            if container.pid_disk is not None:
                sandbox.commands.outputs.open(container.pid_disk)
            if unpacking is not None:
                unpacking.join()
                unpacking = None
                if sandbox._unpacked is not None:
                    raise sandbox._unpacked
            # Two agent channels warm up in the background: the first tool call comes after the model's first
            # reply, and a parallel batch of two pays no docker exec.
            threading.Thread(target=sandbox.channels.warm_up, args=(2,), name="pid-channel-warmup",
                             daemon=True).start()
        except BaseException:
            if unpacking is not None:   # its writes go to the disk that close() removes: it ends first
                unpacking.join()
            sandbox.close()
            raise
        return sandbox

    def _unpack_early(self, uploaded: UploadedWorkspace, stream: IO[bytes]) -> threading.Thread:
        """Unpack `stream` into the workspace in a thread, as the container starts; its error in self._unpacked."""
        def unpack() -> None:
            try:
                uploaded.unpack(stream, trusted=False)
                uploaded.early = stream
            except BaseException as exc:
                self._unpacked = exc
        thread = threading.Thread(target=unpack, name="pid-workspace-unpack", daemon=True)
        thread.start()
        return thread

    def is_alive(self) -> bool:
        """The container exists and runs (one engine request)."""
        return self.container.is_alive()

    def kill(self) -> None:
        """Force-remove the container now, from any thread: every wait on it ends (the watchdog's tool). On purpose:
        nothing is revived after it."""
        with self._swapping:
            self._killed = True
            box = self.container
        box.kill()

    def close(self) -> None:
        """Remove the container (forced) and its disk. Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        self.workspace.close()
        self.channels.close()
        self.container.remove()
        self.processes.close()
        self.commands.outputs.close()
        self.commands.memory.close()
        self.container.release()

    def __enter__(self) -> "DockerSandbox":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def run_as_pid(self, script: str, what: str, timeout: float = 600.0) -> bytes:
        """One of pid's own scripts as root on the control channel (ExecChannels.run_as_pid)."""
        return self.channels.run_as_pid(script, what, timeout)

    # -- the Sandbox protocol ---------------------------------------------------------------------------------
    @engine_errors
    def exec(self, command: str, *, timeout: float, output: OutputPolicy = DEFAULT_OUTPUT,
             on_output: Callable[[bytes], None] | None = None,
             cancel: threading.Event | None = None) -> ExecResult:
        return self.commands.exec(command, timeout=timeout, output=output, on_output=on_output, cancel=cancel)

    @engine_errors
    def read_file(self, path: str, *, max_bytes: int | None = None, timeout: float = FILE_TIMEOUT_S,
                  cancel: threading.Event | None = None) -> bytes:
        return self.commands.read_file(path, max_bytes=max_bytes, timeout=timeout, cancel=cancel)

    @engine_errors
    def readable_files(self, paths: Sequence[str], *, timeout: float = FILE_TIMEOUT_S) -> set[str]:
        return self.commands.readable_files(paths, timeout=timeout)

    @engine_errors
    def write_file(self, path: str, data: bytes, *, timeout: float = FILE_TIMEOUT_S,
                   cancel: threading.Event | None = None) -> None:
        self.commands.write_file(path, data, timeout=timeout, cancel=cancel)

    # -- workspace in, results out -----------------------------------------------------------------------------
    @engine_errors
    def import_workspace(self, host_path: str, timeout: float = 600.0) -> None:
        self.workspace.import_workspace(host_path, timeout)

    @engine_errors
    def import_tar(self, stream: IO[bytes], timeout: float = 600.0) -> None:
        self.workspace.import_tar(stream, timeout)

    @engine_errors
    def import_git(self, url: str, ref: str | None, timeout: float = 600.0) -> str:
        return self.workspace.import_git(url, ref, timeout)

    @engine_errors
    def import_image(self, timeout: float = 600.0) -> None:
        self.workspace.import_image(timeout)

    @contextlib.contextmanager
    def _memory_told(self) -> Iterator[None]:
        """pid's own work that fails in a container that ran out of memory says so: the kernel may have killed pid's
        server there, and would again."""
        try:
            yield
        except SandboxError as exc:
            if self.commands.memory.ever_ran_out():
                exc.args = (f"{exc} ({OUT_OF_MEMORY_EARLIER})",)
            raise

    def _revivable(self, work: Callable[[], T], redo: Callable[[], bool] = lambda: True) -> T:
        """pid's `work` after the agent, done again, once, on a revived container (_revive) when it failed because the
        container is gone; `redo`: whether the failed attempt left nothing that a second one would trip on."""
        with self._memory_told():
            try:
                return work()
            except SandboxError:
                if not (redo() and self._revive()):
                    raise
            return work()

    def _revive(self) -> bool:
        """When the agent's container is gone (not removed by pid: the kernel's memory kill took it down, or someone
        removed it), or ran out of memory (the kernel may have killed pid's server in it), and its disks are here, a
        fresh container on them takes its place, with nothing of the agent's running: the patch and the files are not
        lost with it. Not for a root agent, which could have replaced what pid's servers run there. Once; whether it
        did (a revival that fails is logged: the first error is the one that counts)."""
        gone = self.container
        if self._revived or self._killed or gone.removed_by_pid or gone.released or gone.disk is None or gone.uid == 0:
            return False
        # (one still running whose memory ran out: pid's server there was killed, and /dev/shm stays full)
        if gone.is_alive() and not self.commands.memory.ever_ran_out():
            return False
        self._revived = True
        gone.remove()   # (one stopped but not yet removed goes too, and one that ran out of memory)
        try:
            box = launch_on_disks_of(gone)
        except SandboxError as exc:
            log.warning("job %s: its container is gone, and a fresh one on its disks could not be made: %s",
                        gone.config.job_id, exc)
            return False
        channels = ExecChannels(box)
        try:
            box.start()
            events = channels.start_control()
        except BaseException as exc:
            channels.close()
            box.remove()
            if not isinstance(exc, SandboxError):
                raise
            log.warning("job %s: its container is gone, and a fresh one on its disks did not start: %s",
                        gone.config.job_id, exc)
            return False
        with self._swapping:   # (a kill meanwhile, the collection's deadline, is for the new container too)
            killed = self._killed
            if not killed:
                take_disks(gone)
                self.channels.close()
                self.processes.close()
                self.container, self.channels = box, channels
                self.processes = ProcessTable(box, channels)
                self.processes.events = events
                self.workspace.moved(box, channels)
        if killed:
            channels.close()
            box.remove()
            return False
        log.warning("job %s: its container was gone; pid collects what the agent left from a fresh one on its disks",
                    box.config.job_id)
        return True

    @engine_errors
    def export_patch(self, dest: str, max_bytes: int, timeout: float = 600.0) -> PatchCopy:
        """Write the workspace's changes since the base commit to host file `dest` (made by pid's git, as root,
        from pid's repository; paths validated, size capped). A container found gone is revived for it (_revive)."""
        return self._revivable(lambda: self._export_patch(dest, max_bytes, timeout))

    def _export_patch(self, dest: str, max_bytes: int, timeout: float) -> PatchCopy:
        self.processes.clear()   # nothing of the agent may run on (swap files, hold FIFOs) while pid's git reads
        free_reserve(self.container.disk)   # the room kept for an image's base (see launch._reserve)
        base = self.workspace.base(timeout)
        self.commands.outputs.clear()   # the agent's outputs go (its processes are): pid's disk is the patch's
        room = f"{PID_DIR}/patch"
        said = self.run_as_pid(patch_script(self.workdir, base, room, max_bytes), "making the patch", timeout)
        left_out = unrecorded(said, self.workdir, max_bytes)   # (before the copy: a failing patch leaves no file)
        copy = copy_patch_out(self.container, room, dest, max_bytes)
        said_already = {skipped.path for skipped in copy.dropped}   # (a repository whose commit changed: dropped there)
        copy.dropped[:0] = [Skipped(escaped(path), why) for path, why in left_out
                            if why != NESTED_WHY or escaped(path) not in said_already]
        return copy

    @engine_errors
    def export_files(self, paths: list[str], dest_dir: str, budget: FilesBudget) -> tuple[list[str], list[Skipped]]:
        """Copy in-container files or directories into `dest_dir`, under their in-container paths; (host paths
        written, what was skipped and why). Limits and name checks: pid.sandbox.artifacts. A path with a link on
        its way is skipped: the engine copies as root and follows it, to files the agent cannot read (pid's git, the
        image's /etc/shadow). Every process of the agent's is killed first: nothing may swap a path for a link
        between the look and the copy."""
        return self._revivable(lambda: self._export_files(paths, dest_dir, budget),
                               redo=lambda: not os.path.exists(dest_dir))   # (nothing copied, nothing charged)

    def _export_files(self, paths: list[str], dest_dir: str, budget: FilesBudget) -> tuple[list[str], list[Skipped]]:
        self.processes.clear()   # (in a check's container, what the tests left may still run)
        linked = self._linked_on_the_way(paths)
        written, skipped = export_files(self.container, [p for p in paths if p not in linked], dest_dir, budget)
        return written, [Skipped(escaped(p), "a link on its way") for p in paths if p in linked] + skipped

    def _linked_on_the_way(self, paths: list[str]) -> set[str]:
        """The paths one of whose directories (below the workdir, for a relative one) is a link: looked for as the
        engine looks (it cleans a path lexically first, and follows the last component too when a "/" ends it)."""
        ways: dict[str, set[str]] = {}
        for path in paths:
            parts = [part for part in posixpath.normpath(path).split("/") if part not in ("", ".")]
            start = "/" if path.startswith("/") else self.workdir
            last = len(parts) + 1 if path.endswith(("/", "/.")) else len(parts)
            for n in range(1, last):
                ways.setdefault(posixpath.join(start, *parts[:n]), set()).add(path)
        if not ways:
            return set()
        names = list(ways)
        said = self.run_as_pid("n=0; for p in " + " ".join(shlex.quote(name) for name in names) +
                               '; do if [ -L "$p" ]; then echo "$n"; fi; n=$((n + 1)); done', "looking for links",
                               FILE_TIMEOUT_S)
        return {path for n in said.split() for path in ways[names[int(n)]]}


class DockerProvider:
    """pid.sandbox_lifecycle.SandboxProvider on a Docker engine: the runner makes its job's sandbox through this."""

    def __init__(self, client: docker.DockerClient | None = None) -> None:
        self.client = client   # None: connect from the environment at each create

    def create(self, config: SandboxConfig, workspace: IO[bytes] | None = None) -> DockerSandbox:
        return DockerSandbox.create(config, self.client, workspace)

    @engine_errors
    def clear_job(self, job_id: str) -> None:
        """What the job's lost attempts left: their containers, then their disks (a worker that died left them
        mounted; their locks died with it). The sweep that put the job back may have run where those disks are not
        (a client's `pid result --wait` on another PID_HOME), so the retry clears them here."""
        remove_job_containers(job_id, self.client)
        reap_disks(default_disk_root())
