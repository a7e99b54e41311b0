"""`pid.sandbox.Sandbox` on Docker: one hardened, labelled, self-expiring container per task.

Commands, reads and writes go through a pool of exec channels (see channel.py): no `docker exec` per call. A
separate control channel does pid's own work as root (kills, the base commit, the patch), where the agent, which
runs as another uid with no capabilities, cannot reach it. Everything the job can write lives on a per-job
filesystem of a fixed size; the image's own filesystem is read-only, but for the trees a task image's job may change
(`--workdir`: image_fs.py), whose writes land on that filesystem too. pid's own files that the agent's work must not
starve (the commands' output, the servers' pipes, the patch in the making) are on a second filesystem, pid's own
(see PID_DISK). Files cross the host boundary only as tar streams, built and extracted without following links,
bounded in size and validated name by name.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import posixpath
import shutil
import tarfile
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import IO, Any, Callable, cast

import docker
import docker.errors
import requests.exceptions
from docker.types import Mount, Ulimit

from pid.sandbox import DEFAULT_OUTPUT, ExecResult, OutputPolicy, SandboxLost
from pid.sandbox_lifecycle import FilesBudget, PatchCopy, Skipped

from . import fileops
from .artifacts import copy_patch, extract_files
from .channel import (PID_DIR, RUN_DIR, Channel, ChannelClosed, PipeLink, SetupFailed, TableFull,
                      entry_command, install_script)
from .config import (AGENT_HOME, BASE_ENV, LABEL_ATTEMPT, LABEL_CREATED, LABEL_EXPIRES, LABEL_JOB, LABEL_OWNER,
                     SandboxConfig, parse_user)
from .disk import DiskError, JobDisk, disks_supported
from .docker_client import connect, ensure_image
from .errors import SandboxError
from .output_trim import trim_front
from .outputs import KeptOutputs
from .pool import ChannelPool
from .processes import ProcessGauge, kill_agent_processes
from .reaper import force_remove, owner_label, remove_job_containers, run_labels
from .seccomp import SECURITY_OPT
from .gitseed import GitSeed
from .image_env import image_env, neutralised
from .image_fs import BASE_TARGET, ImageFS, image_layers
from .workspace import (UnsafeTar, WorkspaceTooLarge, base_script, build_tar, patch_script, sanitize_tar,
                        unpack_tar)

log = logging.getLogger(__name__)

MAX_CHANNELS = 8
PRESTARTED = (("control", 1), ("agent", 2), ("agent", 3))   # the servers the container's entry starts (role, id)
PRESTARTED_HELLO_S = 10.0   # for one of them to answer; past it (or on any error) pid starts one with `docker exec`
FIFO_RUNTIMES = ("runc", "io.containerd.runc.v2")   # runtimes whose containers open the host's FIFOs
# and share the host's kernel. Any other runtime (gVisor's runsc) runs a kernel of its own: the pids cgroup then
# counts the runtime's host tasks, not the agent's processes (gVisor's ptrace platform spends about 8-12 host tasks
# on each process it runs, and dies when the cgroup refuses it one). There the agent's processes are bounded by
# RLIMIT_NPROC, which that kernel counts per sandbox, and the cgroup gets room for what the runtime spends on them.
HOST_TASKS_PER_GUEST_PROCESS = 12
RUNTIME_HOST_TASKS = 256
OUTPUT_POLL_S = 0.75       # on_output cadence
OUTPUT_CHUNK = 16384       # at most this much of the newest output per on_output call
CANCEL_POLL_S = 0.1        # how often a waiting call looks at its cancel Event
KILL_GRACE_S = 10.0        # after SIGKILL, the server must report the end within this
FILE_TIMEOUT_S = 120.0     # a read or write of the tools, start to end
READ_LIMIT = 64 << 20      # the most one read_file returns, whatever the caller asks
CONTROL_TIMEOUT_S = 30.0   # a control request (kill, poll) must be answered within this
KEEP_OUTPUT = 64 << 20     # a command's kept output file holds at most about its last this-many bytes...
TRIM_EVERY_S = 1.0         # ...checked this often while it runs
HOUSEKEEPING_TIMEOUT_S = 5.0
DISK_FULL_BELOW = 1 << 20  # the job's disk counts as full, for the model's notice, with less than this left
RESERVE = "reserve"        # in /.pid: the room an image's base keeps on a writable image's disk (see _reserve)
RESERVE_MAX = 64 << 20
# pid's own disk, beside the job's: the commands' output files (/.pid/out), the servers' pipes (/.pid/run) and the
# patch in the making (/.pid/patch: git's index and the objects of the changes, the diff). The agent cannot write
# there but through its commands' output, which the host bounds (outputs.py, output_trim.py), and which it removes
# before the patch is made, once the agent's processes are gone: whatever the agent does to the job's disk (every
# block, every inode), a command's output reaches the model and the patch is made. The diff and the objects of the
# changed files must fit in it: a larger change fails the patch, as one past --max-patch does. Sparse, like the
# job's disk: the host pays for what is written.
PID_DISK = 1 << 30
PID_DISK_DIRS = {"out": 0o711, "run": 0o700, "patch": 0o700}   # each bound at /.pid/<name>

# pid's in-container machinery runs as root with only these capabilities; the agent (another uid) gets none:
#   SETUID, SETGID  setpriv drops each agent command to the agent's uid and gid
#   SETPCAP         ... and empties its capability bounding set
#   KILL            signal the agent's processes (timeouts, cancel, a full process table)
#   CHOWN           give the workspace and home to the agent's uid at start
#   DAC_READ_SEARCH git reads every workspace file for the patch, whatever modes the agent set
MACHINERY_CAPABILITIES = ["SETUID", "SETGID", "SETPCAP", "KILL", "CHOWN", "DAC_READ_SEARCH"]
# With `--user root` the agent shares pid's uid; it also gets what root is expected to do in its own workspace.
ROOT_AGENT_CAPABILITIES = ["DAC_OVERRIDE", "FOWNER", "FSETID", "NET_BIND_SERVICE"]

NOFILE_MAX = 8192          # below the engine's own limit on common hosts (runc refuses to raise it)
FILE_TABLE_SHARE = 8       # one job's processes x open files stay under 1/8 of the host's file table


def agent_env(uid: int) -> dict[str, str]:
    """The environment of pid's servers in the container, and so of the agent's commands."""
    return dict(BASE_ENV, USER="root" if uid == 0 else "agent")


_default_runtimes: dict[str, str] = {}


def default_runtime(client: docker.DockerClient) -> str:
    """The engine's default runtime (asked once per engine and process: dockerd must restart to change it)."""
    url = str(client.api.base_url)
    if url not in _default_runtimes:
        try:
            _default_runtimes[url] = str(client.info().get("DefaultRuntime") or "runc")
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return "unknown"   # (not kept: asked again next time)
    return _default_runtimes[url]


def _reserve(disk: JobDisk, size: int) -> None:
    """Room on the job's disk for an image's base, which pid records there while the agent works (and again as the
    patch is made, when the agent's writes got in its way). The agent's writes to the image go through overlayfs with
    its mounter's (root's) credentials, so ext4's blocks reserved for root do not stop them. A file of root's in /.pid
    (posix_fallocate: no data written) holds the room; export_patch frees it first."""
    fd = os.open(os.path.join(disk.path("pid"), RESERVE), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                 | os.O_CLOEXEC, 0o600)
    try:
        os.posix_fallocate(fd, 0, min(RESERVE_MAX, size // 8))
    finally:
        os.close(fd)


def engine_init(client: docker.DockerClient) -> str | None:
    """The engine's init binary on this host (`--init`'s docker-init), or None when it cannot be found here."""
    try:
        name = str(client.info().get("InitBinary") or "docker-init")
    except (docker.errors.DockerException, requests.exceptions.RequestException):
        name = "docker-init"
    found = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/bin:/usr/bin"]))
    return os.path.realpath(found) if found else None


def _first_channels(run_dir: str) -> list[Channel]:
    """The channels of the servers the container's entry will start (PRESTARTED): their FIFOs made in pid's disk's
    /.pid/run and opened, not yet greeted."""
    channels: list[Channel] = []
    try:
        run_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for role, channel_id in PRESTARTED:
                channels.append(Channel(PipeLink(run_fd, channel_id), channel_id, role))
        finally:
            os.close(run_fd)
    except BaseException as exc:
        for channel in channels:
            channel.close()
        if isinstance(exc, OSError):
            raise SandboxError(f"cannot make the exec channels' pipes: {exc}") from exc
        raise
    return channels


def _make_disks(config: SandboxConfig, layout: dict[str, tuple[int, int, int]]) -> tuple[JobDisk, JobDisk]:
    """The job's disk (`layout`, plus the mount points of pid's disk in its /.pid) and pid's own disk."""
    root, name = config.disk_root or default_disk_root(), f"{config.job_id}-{os.urandom(3).hex()}"
    layout = {**layout, **{f"pid/{sub}": (0, 0, 0o700) for sub in PID_DISK_DIRS}}
    try:
        disk = JobDisk.create(root, name, config.disk, layout=layout)
    except DiskError as exc:
        raise SandboxError(f"cannot make the job's disk: {exc}") from exc
    try:
        return disk, JobDisk.create(root, name + "-pid", PID_DISK,
                                    layout={sub: (0, 0, mode) for sub, mode in PID_DISK_DIRS.items()})
    except BaseException as exc:
        disk.close()
        if isinstance(exc, DiskError):
            raise SandboxError(f"cannot make pid's own disk: {exc}") from exc
        raise


def _close_disks(*disks: JobDisk | None) -> None:
    for disk in disks:
        if disk is not None:
            disk.close()


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def nofile_limit(pids_limit: int, file_max_path: str = "/proc/sys/fs/file-max") -> int:
    """Open files per process such that pids_limit processes cannot fill the host's file table."""
    try:
        with open(file_max_path) as f:
            file_max = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 1024
    return max(64, min(NOFILE_MAX, file_max // (FILE_TABLE_SHARE * max(1, pids_limit))))


def _pid_home() -> str:
    from pid.config import pid_home
    return pid_home()


def default_disk_root() -> str:
    return os.path.join(_pid_home(), "disks")


class DockerSandbox:
    """Implements pid.sandbox_lifecycle.JobSandbox (and so pid.sandbox.Sandbox). Thread-safe: concurrent calls use
    separate channels."""

    def __init__(self, client: docker.DockerClient, container_id: str, config: SandboxConfig,
                 disk: JobDisk | None = None, image_fs: ImageFS | None = None,
                 env: dict[str, str] | None = None, image_id: str | None = None,
                 pid_disk: JobDisk | None = None) -> None:
        self.client = client
        self.container_id = container_id
        self.config = config
        self.workdir = config.workdir
        self.uid, self.gid = parse_user(config.user)
        self.base_commit: str | None = None
        self.shell = "bash"
        self._disk = disk
        self._pid_disk = pid_disk   # pid's own (see PID_DISK); there whenever the job's disk is
        self._image_fs = image_fs
        self._env = env or agent_env(self.uid)   # (an exec's environment adds to the image's: see image_env.py)
        self.image_id = image_id or config.image   # the image it runs, by id (result.json says which)
        self._channel_ids = itertools.count(1)
        self._pool = ChannelPool(self._new_channel, MAX_CHANNELS)
        self._control: Channel | None = None
        self._control_lock = threading.Lock()
        self._closed = False
        self._out_dir_fd: int | None = None   # pid's disk's /.pid/out, opened on the host
        self._out_dir_lock = threading.Lock()
        self._kept = KeptOutputs()            # which finished outputs stay there (under _out_dir_lock)
        self._pids_events = 0                 # forks the pids limit refused, as last seen (or dealt with)
        self._clearings = 0                   # how often the process table was cleared
        self._pids_lock = threading.RLock()
        self._gauge: ProcessGauge | None | bool = None   # the process table seen from the host (False: not readable)
        self._gauge_lock = threading.Lock()
        self._own_kernel = False   # the runtime runs a kernel of its own (see FIFO_RUNTIMES)
        # A container frozen while `docker exec` starts a process in it wedges the engine's shim for good (runc's
        # init freezes half-way): starting a channel and freezing the container exclude each other.
        self._exec_gate = threading.Lock()
        self.removed_by_pid = False       # kill() was called: the container is gone on purpose
        self._agent_started = False       # an agent command (or file op) was started: the workspace may hold its links
        self._seeded = False              # the import wrote the base's objects and index (see _record_base)
        self._early: IO[bytes] | None = None   # the workspace tar create() unpacked already
        self._seed: GitSeed | None = None       # a deferred seed, its tar spooled on the job disk, and its writer:
        self._spool: str | None = None          # the base's blobs are written after the base (see _record_base)
        self._packing: threading.Thread | None = None    # writes the base's blobs on the job disk from the host
        self._recording: threading.Thread | None = None  # records an image's base in the container (import_image)
        self._packing_error: str | None = None   # why the base's background part failed
        self._prestarted: list[Channel] = []   # agent servers the entry started, greeted, not yet pooled
        self._prestarted_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, config: SandboxConfig, client: docker.DockerClient | None = None,
               workspace: IO[bytes] | None = None) -> "DockerSandbox":
        """Start the container and its control channel; two agent channels warm up in the background.

        `workspace`: a workspace tar to unpack onto the job's disk while the engine starts the container (the
        engine's ~0.5 s and the unpacking overlap); import_tar(workspace) then only records the base. Without a
        job disk it is left for import_tar.

        Raises ImageNotFound / DockerUnavailable / SandboxError (also for a disk limit that cannot be applied, or
        a workspace tar that is refused).
        """
        uid, gid = parse_user(config.user)
        client = connect(client)
        inspected = ensure_image(config.image, client)
        image = str(inspected.get("Id") or config.image)   # (its id from here on: a tag may move meanwhile)
        now = datetime.now(timezone.utc)
        ttl = max(1, int(config.ttl_s))
        disk: JobDisk | None = None
        pid_disk: JobDisk | None = None
        image_fs: ImageFS | None = None
        options: dict[str, Any] = {}
        if config.disk:
            reason = disks_supported()
            if reason is None:
                layout = {"workspace": (uid, gid, 0o755), "home": (uid, gid, 0o755), "tmp": (0, 0, 0o1777),
                          "vartmp": (0, 0, 0o1777), "pid": (0, 0, 0o711)}
                if config.writable_image:
                    layout.update({"image": (0, 0, 0o700), "pid/base": (0, 0, 0o700)})
                disk, pid_disk = _make_disks(config, layout)
                options["read_only"] = True
                own = [(AGENT_HOME, "home"), ("/tmp", "tmp"), ("/var/tmp", "vartmp"), (PID_DIR, "pid")]
                if not config.image_workspace:
                    own.insert(0, (config.workdir, "workspace"))
                options["mounts"] = [Mount(target, disk.path(name), type="bind") for target, name in own]
                options["mounts"] += [Mount(f"{PID_DIR}/{sub}", pid_disk.path(sub), type="bind")
                                      for sub in PID_DISK_DIRS]
                if config.writable_image:
                    try:
                        _reserve(disk, config.disk)
                        image_fs = ImageFS.build(image_layers(inspected, config.image), disk.path("image"),
                                                 workdir=config.workdir, uid=uid, gid=gid,
                                                 image_workspace=config.image_workspace,
                                                 taken={target for target, _ in own},
                                                 init_binary=engine_init(client) if uid == 0 else None)
                    except BaseException as exc:
                        _close_disks(disk, pid_disk)
                        if isinstance(exc, OSError):
                            raise SandboxError(f"cannot make the image's filesystem writable: {exc}") from exc
                        raise
                    options["mounts"] += [Mount(tree.target, tree.source, type="bind", read_only=tree.read_only)
                                          for tree in image_fs.mounts()]
            elif config.writable_image:
                raise SandboxError(f"--workdir needs the job's own disk, and {reason or 'there is none (--disk 0)'}")
            else:   # the engine's own quota (overlay2 on xfs with pquota) is the other way to bound the disk
                options["storage_opt"] = {"size": str(config.disk)}
        elif config.writable_image:
            raise SandboxError("--workdir needs the job's own disk: pass a --disk size other than 0")
        caps = MACHINERY_CAPABILITIES + (ROOT_AGENT_CAPABILITIES if uid == 0 else [])
        nofile = nofile_limit(config.pids_limit)
        ulimits = [Ulimit(name="nofile", soft=nofile, hard=nofile)]
        runtime = config.runtime or default_runtime(client)
        host_kernel = runtime in FIFO_RUNTIMES
        own_kernel = not host_kernel and runtime != "unknown"   # (under runc, NPROC would count the agent uid's
        host_tasks = config.pids_limit                           # processes in every container and on the host)
        if own_kernel:   # (see FIFO_RUNTIMES)
            ulimits.append(Ulimit(name="nproc", soft=config.pids_limit, hard=config.pids_limit))
            host_tasks = config.pids_limit * HOST_TASKS_PER_GUEST_PROCESS + RUNTIME_HOST_TASKS
        env = {**agent_env(uid), **neutralised(image_env(inspected))}
        command = ["sleep", str(ttl)]   # exits (and is auto-removed) by itself when orphaned
        first: list[Channel] = []
        # The control server and two agent servers start with the container, on FIFOs of pid's disk (see
        # channel.PipeLink): under runc only (gVisor, for one, keeps the host's FIFOs out of its sandbox), whether
        # named or the engine's default.
        if pid_disk is not None and host_kernel:
            try:
                first = _first_channels(pid_disk.path(RUN_DIR))
            except BaseException:
                if image_fs:
                    image_fs.close()
                _close_disks(disk, pid_disk)
                raise
            command = entry_command(ttl, list(PRESTARTED), config.workdir, uid, gid)
        try:
            container = client.containers.create(
                image, command, environment=env,
                auto_remove=True, init=True, user="0:0",
                log_config={"type": "none"},   # nothing of the container's is logged by the engine (nor fills its disk)
                labels={LABEL_JOB: config.job_id, LABEL_CREATED: _iso(now),
                        LABEL_EXPIRES: _iso(now + timedelta(seconds=ttl)),
                        LABEL_OWNER: config.owner or owner_label(_pid_home()),
                        LABEL_ATTEMPT: str(config.attempt), **run_labels()},
                mem_limit=config.memory, memswap_limit=config.memory,
                nano_cpus=int(config.cpus * 1e9), pids_limit=host_tasks,
                network_mode=config.network,
                security_opt=SECURITY_OPT,   # (no-new-privileges, and pid's seccomp profile: seccomp.py)
                cap_drop=["ALL"], cap_add=caps,
                ulimits=ulimits,
                working_dir=config.workdir, runtime=config.runtime or None,
                **options)
        except BaseException as exc:
            for channel in first:
                channel.close()
            if image_fs:
                image_fs.close()
            _close_disks(disk, pid_disk)
            if "storage_opt" in options and isinstance(exc, docker.errors.DockerException):
                raise SandboxError(
                    f"cannot limit the job's disk: {disks_supported()}, and the engine refused a disk quota "
                    f"({exc}); run the worker as root, or pass --disk 0 for no limit") from exc
            if isinstance(exc, docker.errors.DockerException):
                why = getattr(exc, "explanation", None) or exc   # the engine's own words, without its request
                raise SandboxError(f"cannot create sandbox container from {config.image!r}: {why}") from exc
            raise
        sandbox = cls(client, container.id, config, disk, image_fs, env, image, pid_disk)
        sandbox._own_kernel = own_kernel
        if first:
            sandbox._channel_ids = itertools.count(PRESTARTED[-1][1] + 1)
            sandbox._control, sandbox._prestarted = first[0], first[1:]
        unpacking: threading.Thread | None = None
        unpacked: list[BaseException | None] = []
        try:
            if disk is not None:
                install_script(client.api, container.id, disk.path("pid"))
                if workspace is not None:
                    def unpack() -> None:
                        try:
                            sandbox._unpack(workspace, trusted=False)
                            sandbox._early = workspace
                            unpacked.append(None)
                        except BaseException as exc:
                            unpacked.append(exc)
                    unpacking = threading.Thread(target=unpack, name="pid-workspace-unpack", daemon=True)
                    unpacking.start()
            try:
                container.start()
            except docker.errors.DockerException as exc:
                raise SandboxError(f"cannot start sandbox container from {config.image!r}: {exc}") from exc
            if disk is None:
                install_script(client.api, container.id, None)
            if sandbox._control is not None:   # started with the container: greet them all, await the control's
                sandbox._greet_prestarted()
            if sandbox._control is None:
                sandbox._control = sandbox._open_channel("control")
            sandbox.shell = sandbox._control.shell
            if pid_disk is not None:
                sandbox._out_dir_fd = os.open(pid_disk.path("out"),
                                              os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            sandbox._pids_events = sandbox._control.pids_events
            if unpacking is not None:
                unpacking.join()
                unpacking = None
                if unpacked[0] is not None:
                    raise unpacked[0]
            # Two agent channels warm up in the background: the first tool call comes after the model's first
            # reply, and a parallel batch of two pays no docker exec.
            threading.Thread(target=sandbox._warm_up, args=(2,), name="pid-channel-warmup", daemon=True).start()
        except BaseException:
            if unpacking is not None:   # its writes go to the disk that close() removes: it ends first
                unpacking.join()
            sandbox.close()
            raise
        return sandbox

    def _warm_up(self, count: int) -> None:
        """Two agent channels ready before the first tool call: the entry's servers greeted, else new ones. Callers
        that came first may have taken the entry's servers already: then nothing more is started here."""
        prestarted = bool(self._prestarted)
        for _ in range(count):
            self._pool.grow(self._take_prestarted if prestarted else None)

    def _greet_prestarted(self) -> None:
        """Say hello to the entry's servers and await the control server's answer. One that does not come (an
        engine whose runtime cannot open the host's FIFOs after all, a server that died) drops them all: the
        control server is then started with `docker exec`, as the agents' will be."""
        assert self._control is not None
        try:
            for channel in (self._control, *self._prestarted):
                channel.send_hello(time.monotonic() + PRESTARTED_HELLO_S)
            self._control.await_hello(time.monotonic() + PRESTARTED_HELLO_S, alive=self.is_alive)
        except SetupFailed:
            raise   # (a server through the engine would say the same)
        except Exception as exc:
            log.warning("sandbox %s: its first servers did not answer (%s); starting them with docker exec",
                        self.container_id[:12], exc)
            with self._prestarted_lock:
                dropped, self._prestarted = [self._control, *self._prestarted], []
            self._control = None
            for channel in dropped:
                channel.close()

    def _take_prestarted(self) -> Channel | None:
        """One of the entry's agent servers, once it has answered (None when none is left or it did not answer)."""
        with self._prestarted_lock:
            channel = self._prestarted.pop(0) if self._prestarted else None
        if channel is None:
            return None
        try:
            channel.await_hello(time.monotonic() + PRESTARTED_HELLO_S, alive=self.is_alive)
            return channel
        except BaseException as exc:   # never left open: its FIFOs would keep the job's disk busy
            channel.close()
            if not isinstance(exc, Exception):
                raise
            return None

    def _open_channel(self, role: str) -> Channel:
        with self._exec_gate:
            return Channel.open_exec(self.client.api, self.container_id, next(self._channel_ids), role=role,
                                     workdir=self.workdir, uid=self.uid, gid=self.gid, env=self._env)

    def _new_channel(self) -> Channel:
        """An agent server the container's entry started, once it has answered; else a new one (docker exec)."""
        channel = self._take_prestarted()
        if channel is not None:
            return channel
        try:
            return self._open_channel("agent")
        except SandboxError as exc:
            self._raise_if_lost(exc)
            raise

    def _raise_if_lost(self, cause: BaseException) -> None:
        """A failure that the container's end explains becomes SandboxLost: the job cannot go on."""
        if self.removed_by_pid or not self.is_alive():
            raise SandboxLost(f"the sandbox container is gone ({cause})") from cause

    def is_alive(self) -> bool:
        """The container exists and runs (one engine request)."""
        try:
            state = self.client.api.inspect_container(self.container_id).get("State", {})
        except docker.errors.NotFound:
            return False
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return True   # the engine is slow or busy: not evidence that the container is gone
        return bool(state.get("Running")) and not state.get("Dead")

    def kill(self) -> None:
        """Force-remove the container now, from any thread: every wait on it ends (the watchdog's tool)."""
        self.removed_by_pid = True
        force_remove(self.client, self.container_id)

    def close(self) -> None:
        """Remove the container (forced) and its disk. Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        if self._packing is not None:   # it writes on the job disk: done (a second or so) before the disk goes
            self._packing.join(30.0)
        try:
            self._pool.close()
        except Exception:
            pass
        with self._prestarted_lock:
            prestarted, self._prestarted = self._prestarted, []
        for channel in prestarted:
            channel.close()
        if self._control is not None:   # not under another caller's feet (its descriptors' numbers get reused)
            locked = self._control_lock.acquire(timeout=5.0)
            try:
                self._control.close()
            finally:
                if locked:
                    self._control_lock.release()
        force_remove(self.client, self.container_id)
        with self._gauge_lock:
            if isinstance(self._gauge, ProcessGauge):
                self._gauge.close()
            self._gauge = False
        with self._out_dir_lock:
            self._kept.close()
            if self._out_dir_fd is not None:
                os.close(self._out_dir_fd)
                self._out_dir_fd = None
        if self._disk is not None:
            self._wait_gone(10.0)     # the bind mounts hold the disk busy until the container is really gone
            if self._image_fs is not None:
                self._image_fs.close()
            _close_disks(self._disk, self._pid_disk)

    def _wait_gone(self, limit_s: float) -> None:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            try:
                self.client.api.inspect_container(self.container_id)
            except docker.errors.DockerException:   # NotFound: gone; anything else: nothing better to wait for
                return
            time.sleep(0.05)

    def __enter__(self) -> "DockerSandbox":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- the control channel ------------------------------------------------------------------------------------
    def _with_control(self, fn: Callable[[Channel], Any]) -> Any:
        """fn(control channel), one caller at a time; a broken control channel is replaced once."""
        if self.removed_by_pid:
            raise SandboxLost("the sandbox container was removed")
        if not self._control_lock.acquire(timeout=CONTROL_TIMEOUT_S):
            raise SandboxError("the sandbox's control channel is busy")
        try:
            for attempt in range(2):
                channel = self._control
                if channel is None or channel.broken or not channel.is_idle_clean():
                    if channel is not None:
                        channel.close()
                    self._control = None
                    try:
                        self._control = channel = self._open_channel("control")
                    except SandboxError as exc:
                        self._raise_if_lost(exc)
                        raise
                try:
                    return fn(channel)
                except ChannelClosed:
                    if attempt:
                        raise
        finally:
            self._control_lock.release()

    def _kill_group(self, pgid: int) -> None:
        """SIGKILL a process group inside the container. The control server does it with a builtin: no new process,
        so a full process table cannot stop it. If even that fails, the container goes: nothing may outlive a kill."""
        try:
            self._with_control(lambda ch: ch.kill(pgid, time.monotonic() + CONTROL_TIMEOUT_S))
        except SandboxLost:
            raise
        except SandboxError as exc:
            log.warning("cannot kill process group %s (%s): removing the container", pgid, exc)
            self.kill()
            raise SandboxLost(f"could not stop a command inside the sandbox ({exc}); the container was removed") \
                from exc

    def _clear_process_table(self) -> int:
        """After the pids limit was hit: kill every process of the agent, so that the next call can start; how many.
        From the host with the container frozen where possible (a fork bomb cannot race it, nor starve it of CPU);
        else by pid's server inside, with builtins. The forks refused until then count as dealt with: a later reply
        that shows them must not clear the table again (killing what that command left running)."""
        sweep = None
        if not self._own_kernel:   # (the host sees none of the agent's processes under a kernel of the runtime's)
            with self._exec_gate:   # (only the freeze excludes starting a channel: the waits below are outside)
                sweep = kill_agent_processes(self.client, self.container_id, self.uid)
        if sweep is None:
            killed, refused = self._with_control(
                lambda ch: ch.kill_agent_processes(time.monotonic() + CONTROL_TIMEOUT_S))
        elif not sweep.thawed:   # nothing can run in it any more: it goes
            self.kill()
            raise SandboxLost("the sandbox container could not be thawed after its process table was cleared; "
                              "it was removed")
        else:
            killed, refused = len(sweep.killed), sweep.wait()
        with self._pids_lock:
            self._pids_events = max(self._pids_events, refused or 0)
            self._clearings += 1
        return killed

    def run_as_pid(self, script: str, what: str, timeout: float = 600.0) -> bytes:
        """Run one of pid's own scripts as root on the control channel; its output (at most 16 KiB).

        Raises SandboxError when it fails or outlives `timeout` (the channel is then dropped; what still runs ends
        with the container, which the runner's collection deadline removes).
        """
        return self._with_control(lambda channel: _run_script(channel, script, what, timeout))

    def _run_as_pid_aside(self, script: str, what: str, timeout: float) -> bytes:
        """run_as_pid on a root channel of its own: a long script (hashing a large tree) while the agent works must
        never hold the control channel, which kills the agent's commands."""
        with self._exec_gate:
            channel = Channel.open_exec(self.client.api, self.container_id, next(self._channel_ids), role="control",
                                        workdir=self.workdir, uid=self.uid, gid=self.gid, env=self._env)
        try:
            return _run_script(channel, script, what, timeout)
        finally:
            channel.close()

    # -- the Sandbox protocol ---------------------------------------------------------------------------------
    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else posixpath.join(self.workdir, path)

    def _acquire(self) -> Channel:
        """A pooled agent channel. A dead idle channel was already replaced by the pool; a new one that cannot
        start because the container is gone raises SandboxLost."""
        if self.removed_by_pid:
            raise SandboxLost("the sandbox container was removed")
        channel = self._pool.acquire()
        assert channel is not None   # a blocking acquire waits rather than return None
        return channel

    def _start(self, command: bytes | str, emit: int, deadline: float,
               upload: bytes | None) -> tuple[Channel, int, str]:
        """Start a command on a pooled agent channel, which stays lent until its reply is read; (channel, pgid,
        output file). A full process table is cleared first. A channel whose server died while idle is replaced and
        the start retried: a dead server ran nothing."""
        cleared = False
        for attempt in range(MAX_CHANNELS + 1):
            try:
                channel = self._acquire()
            except SandboxLost:
                raise
            except SandboxError:   # no new channel could start: a full process table is the usual reason
                if cleared or self.uid == 0:
                    raise
                self._clear_process_table()
                cleared = True
                continue
            try:
                direct = upload is None and channel.hands_over() and self._table_has_room()
                pgid, out_path = channel.start(command, emit, deadline, upload=upload, direct=direct)
                return channel, pgid, out_path
            except TableFull:
                self._pool.release(channel)
                if cleared or self.uid == 0:
                    raise
                self._clear_process_table()
                cleared = True
            except ChannelClosed as exc:
                self._pool.discard(channel)
                self._raise_if_lost(exc)
                if attempt == MAX_CHANNELS:
                    raise
            except BaseException as exc:
                self._pool.discard(channel)
                if isinstance(exc, SandboxError) and not isinstance(exc, SandboxLost):
                    self._raise_if_lost(exc)
                raise
        raise AssertionError("unreachable")

    def _table_has_room(self) -> bool:
        """Whether a command may go straight to its waiting shell: the host sees room in the container's process
        table. Otherwise it goes through the server, which refuses it when the table is full (then it is cleared)."""
        gauge = self._gauge
        if gauge is None:
            with self._gauge_lock:
                if self._gauge is None:
                    self._gauge = (ProcessGauge.open(self.container_id)
                                   or ProcessGauge.open(self.container_id, self._init_pid()) or False)
                gauge = self._gauge
        if not isinstance(gauge, ProcessGauge):
            return False
        try:
            return gauge.has_room()
        except (OSError, ValueError):
            return False

    def _init_pid(self) -> int | None:
        try:
            return int(self.client.api.inspect_container(self.container_id)["State"]["Pid"]) or None
        except (docker.errors.DockerException, requests.exceptions.RequestException, KeyError, ValueError):
            return None

    def _run(self, command: bytes | str, *, emit: int, timeout: float, cancel: threading.Event | None,
             collect: Callable[[Channel, float], Any], upload: bytes | None = None,
             on_output: Callable[[bytes], None] | None = None) -> tuple[str | None, Any, int, str]:
        """Start a command on an agent channel and wait for its end, its deadline or cancel; (stop reason, reply,
        how often the process table had been cleared before it: a clearing since, to start it or while it ran, may
        have killed its processes, its output file: the caller settles it, see _finished).

        On timeout or cancel its process group is killed inside the container before this returns. The deadline
        counts from before the command (and its upload) is sent; the start itself has its own bound, not the call's:
        a start given up half-way could still run its command later, out of reach, while one that ends past the
        deadline is killed at once below, as timed out. (A command is at most a tool argument's size: see
        pid/tools/registry.py's MAX_ARGUMENT_BYTES.)
        """
        self._agent_started = True
        started = time.monotonic()
        deadline = started + timeout
        clearings = self._clearings
        self._sweep_outputs()
        channel, started_pgid, out_path = self._start(command, emit, started + CONTROL_TIMEOUT_S, upload)
        pgid: int | None = started_pgid   # None once the command has ended: nothing left to kill
        try:
            next_poll = started + OUTPUT_POLL_S
            next_trim = started + TRIM_EVERY_S
            polled = cut = 0
            stop: str | None = None
            while True:
                now = time.monotonic()
                if cancel is not None and cancel.is_set():
                    stop = "cancelled"
                    break
                if now >= deadline:
                    stop = "timed_out"
                    break
                if now >= next_trim:
                    cut = self._trim_output(out_path, cut)
                    self._sweep_outputs()
                    next_trim = time.monotonic() + TRIM_EVERY_S
                wake = min(deadline, next_trim)
                if cancel is not None:
                    wake = min(wake, now + CANCEL_POLL_S)
                if on_output is not None:
                    if now >= next_poll:
                        polled = self._poll_output(out_path, polled, on_output)
                        next_poll = time.monotonic() + OUTPUT_POLL_S
                    wake = min(wake, next_poll)
                reply = collect(channel, wake)
                if reply is not None:
                    break
            if stop is not None:
                self._kill_group(started_pgid)
                reply = collect(channel, time.monotonic() + KILL_GRACE_S)
                if reply is None:
                    raise SandboxError(f"command did not end after SIGKILL of its process group {pgid}")
            pgid = None
        except BaseException as exc:
            if pgid is not None:   # interrupted while the command runs: it must not outlive us
                try:
                    self._kill_group(pgid)
                except Exception:
                    pass
            self._pool.discard(channel)
            if isinstance(exc, SandboxError) and not isinstance(exc, SandboxLost):
                self._raise_if_lost(exc)
            raise
        self._pool.release(channel)
        return stop, reply, clearings, out_path

    def exec(self, command: str, *, timeout: float, output: OutputPolicy = DEFAULT_OUTPUT,
             on_output: Callable[[bytes], None] | None = None,
             cancel: threading.Event | None = None) -> ExecResult:
        stop, reply, clearings, out_path = self._run(
            command, emit=output.tail_bytes + 1, timeout=timeout, cancel=cancel, on_output=on_output,
            collect=lambda ch, deadline: ch.wait_exec(deadline, output))
        self._finished(out_path, kept=reply.kept_path is not None)
        with self._pids_lock:   # forks failed while it ran: clear what is left (once, for parallel calls)
            refused = reply.pids_events > self._pids_events
            pids_hit = refused or self._clearings != clearings
            self._pids_events = max(self._pids_events, reply.pids_events)
            if refused and self.uid != 0:
                self._clear_process_table()
        return ExecResult(
            exit_code=None if stop else reply.exit_code, tail=reply.tail, total_bytes=reply.total_bytes,
            total_lines=reply.total_lines, timed_out=stop == "timed_out", cancelled=stop == "cancelled",
            output_path=reply.kept_path, output_from=reply.kept_from, pids_limit_hit=pids_hit,
            disk_full=self._disk_full())

    def _finished(self, out_path: str, kept: bool) -> None:
        """A command's reply is read: its output file on pid's disk is removed, or kept for the model (outputs.py)."""
        with self._out_dir_lock:
            if self._out_dir_fd is not None:
                self._kept.finished(self._out_dir_fd, posixpath.basename(out_path), kept)

    def _sweep_outputs(self) -> None:
        """Removed outputs that processes left behind still write are cut back (outputs.py)."""
        with self._out_dir_lock:
            if self._out_dir_fd is not None:
                self._kept.sweep(self._out_dir_fd)

    def _disk_full(self) -> bool:
        """The job's disk has no room left for the agent's writes (blocks or inodes): a command that hides its errors
        (or a file tool's plain ENOSPC) says no more, so the model is told. One statvfs on the host."""
        if self._disk is None:
            return False
        try:
            st = os.statvfs(self._disk.mountpoint)
        except OSError:
            return False
        free = st.f_bfree if self.uid == 0 else st.f_bavail   # (root may use the blocks ext4 reserves for it)
        return free * st.f_frsize < DISK_FULL_BELOW or st.f_favail == 0

    def _file_op(self, snippet: bytes, path: str, *, emit: int, timeout: float, cancel: threading.Event | None,
                 upload: bytes | None = None) -> bytes:
        stop, done, _, out_path = self._run(snippet, emit=emit, timeout=timeout, cancel=cancel, upload=upload,
                                            collect=lambda ch, deadline: ch.finish(deadline))
        self._finished(out_path, kept=False)
        if stop == "cancelled":
            raise InterruptedError(f"cancelled: {path}")
        if stop == "timed_out":
            raise TimeoutError(f"no answer within {timeout:g}s: {path}")
        fileops.raise_for_status(done.exit_code, path)
        return done.head

    def read_file(self, path: str, *, max_bytes: int | None = None, timeout: float = FILE_TIMEOUT_S,
                  cancel: threading.Event | None = None) -> bytes:
        limit = READ_LIMIT if max_bytes is None else max(0, min(max_bytes, READ_LIMIT))
        target = self._abs(path)
        return self._file_op(fileops.read_snippet(self.shell, target, limit), target, emit=limit, timeout=timeout,
                             cancel=cancel)

    def write_file(self, path: str, data: bytes, *, timeout: float = FILE_TIMEOUT_S,
                   cancel: threading.Event | None = None) -> None:
        target = self._abs(path)
        data = bytes(data)
        inline = fileops.inline_write_snippet(target, data, fileops.INLINE_MAX) if self.shell == "bash" else None
        if inline is not None:   # a short command: the host can hand it to the slot shell itself (Channel.start)
            self._file_op(inline, target, emit=0, timeout=timeout, cancel=cancel)
            return
        self._file_op(fileops.write_snippet(self.shell, target, len(data)), target, emit=0, timeout=timeout,
                      cancel=cancel, upload=data)

    # -- helpers -----------------------------------------------------------------------------------------------
    def _on_spare_channel(self, fn: Callable[[Channel], Any]) -> Any:
        """fn(an idle pooled channel) if one is free right now, else None: housekeeping (progress, trimming) never
        waits, never starts a channel, never holds up the control channel that kills depend on, and never fails the
        command it watches."""
        channel = self._pool.take_idle()
        if channel is None:
            return None
        try:
            result = fn(channel)
        except SandboxError as exc:
            log.info("housekeeping request failed: %s", exc)
            self._pool.discard(channel)
            return None
        except BaseException:
            self._pool.discard(channel)
            raise
        self._pool.release(channel)
        return result

    def _trim_output(self, out_path: str, cut: int) -> int:
        """Keep a long-running command's output from filling the job's disk: beyond KEEP_OUTPUT only its tail is
        kept. Returns the bytes cut so far. With a job disk the host cuts it (output_trim); without one, a spare
        channel does."""
        with self._out_dir_lock:   # (a copy of the descriptor: close() may run meanwhile and its number be reused)
            dir_fd = None if self._out_dir_fd is None else os.dup(self._out_dir_fd)
        if dir_fd is not None:
            try:
                return trim_front(dir_fd, posixpath.basename(out_path), KEEP_OUTPUT)
            except OSError as exc:
                log.info("cannot trim %s: %s", out_path, exc)
                return cut
            finally:
                os.close(dir_fd)
        done = self._on_spare_channel(
            lambda ch: ch.trim(out_path, KEEP_OUTPUT, time.monotonic() + HOUSEKEEPING_TIMEOUT_S))
        return cut if done is None else done

    def _poll_output(self, out_path: str, offset: int, on_output: Callable[[bytes], None]) -> int:
        """Hand output appended since `offset` to on_output, through a spare channel if one is free."""
        got = self._on_spare_channel(
            lambda ch: ch.tail(out_path, offset, OUTPUT_CHUNK, time.monotonic() + HOUSEKEEPING_TIMEOUT_S))
        if got is None:
            return offset
        size, chunk = got
        if chunk:
            on_output(chunk)
        return max(offset, size)

    # -- workspace in, results out -----------------------------------------------------------------------------
    def import_workspace(self, host_path: str, timeout: float = 600.0) -> None:
        """Copy a host directory into workdir (owned by the agent) and record it as the base of the patch, in a
        repository of pid's own outside the workspace. The host directory is only read (never followed through
        links, never touched by git)."""
        try:
            spool = build_tar(host_path, self.uid, self.gid, self.config.max_workspace)
        except WorkspaceTooLarge:
            raise SandboxError(f"{host_path} is larger than the workspace limit "
                               f"({self.config.max_workspace} bytes once packed)") from None
        with spool:
            self._unpack(spool, trusted=True)
        self._record_base(timeout)

    def import_tar(self, stream: IO[bytes], timeout: float = 600.0) -> None:
        """Unpack a workspace tar read from `stream` (as `pid submit` packed it, on whatever machine: checked member
        by member, see workspace.MemberCheck) into workdir as it arrives, and record it as the base. If create()
        unpacked this very stream already, only the base is left to record."""
        if stream is not self._early:
            self._unpack(stream, trusted=False)
        self._early = None
        self._record_base(timeout)

    def import_git(self, url: str, ref: str | None, timeout: float = 600.0) -> str:
        """Clone `url` at `ref` into workdir, git running in a container of its own (sandbox.clone), and record the
        checkout as the base; returns the commit cloned."""
        from .clone import clone_into
        config = dataclasses.replace(self.config, owner=self.config.owner or owner_label(_pid_home()))
        commit = clone_into(self.client, config, url, ref, lambda tar: self._unpack(tar, trusted=False), timeout)
        self._record_base(timeout)
        return commit

    def import_image(self, timeout: float = 600.0) -> None:
        """The workspace is the image's own workdir, as it is: nothing to copy. Its base is recorded while the agent
        works, from pid's read-only view of it (the image's layers never change, whatever the agent does)."""
        if self._image_fs is None or self._image_fs.base is None:
            raise SandboxError("this sandbox's workspace is not the image's own directory")
        # (what would make the recording fail later, said before the model is paid for)
        self.run_as_pid("command -v git >/dev/null || { echo 'the image has no git, which pid needs to make the "
                        "patch'; exit 1; }", "looking for git", timeout)

        def record() -> None:
            try:
                self.base_commit = self._record_image_base(self._run_as_pid_aside, timeout)
            except BaseException as exc:
                self._packing_error = f"cannot record the base commit: {exc}"
        self._recording = threading.Thread(target=record, name="pid-image-base", daemon=True)
        self._recording.start()

    @staticmethod
    def _record_image_base(run: Callable[[str, str, float], bytes], timeout: float) -> str:
        """An image's base commit, from pid's read-only view of its workdir, run by `run` (a run_as_pid)."""
        return _commit(run(base_script(BASE_TARGET), "recording the base commit", timeout))

    def _unpack(self, stream: IO[bytes], trusted: bool) -> None:
        """A workspace tar into workdir. `trusted`: build_tar made it here (else every member is checked)."""
        try:
            if self._disk is not None and not self._agent_started and not os.listdir(self._disk.path("workspace")):
                # Straight into the job disk's workspace directory as the tar streams in: no engine request
                # (put_archive re-executes the engine in the container, 130-250 ms here), no copy. Only before any
                # agent command, into the empty directory: until then nothing in it is the agent's, so nothing there
                # can redirect the host's writes. The base's git objects and index are written on the way (gitseed).
                seed = self._new_seed()
                if seed is None or not seed.deferred:
                    unpack_tar(stream, self._disk.path("workspace"), self.uid, self.gid, seed)
                    self._seeded = seed is not None and seed.unusable is None
                    return
                spool = os.path.join(seed.git_dir, "pid-workspace.tar")   # the tar again, for the deferred pack
                with open(spool, "xb", buffering=1 << 20) as copy:
                    unpack_tar(cast(IO[bytes], _Tee(stream, copy)), self._disk.path("workspace"), self.uid, self.gid,
                               seed)
                if seed.unusable is None:
                    self._seeded, self._seed, self._spool = True, seed, spool
                else:
                    os.unlink(spool)
                return
            if trusted:
                ok = self.client.api.put_archive(self.container_id, self.workdir, stream)
            else:   # the engine unpacks as root in the container: it gets only what the checks let through
                with tempfile.TemporaryFile(prefix="pid-import-") as staged:
                    sanitize_tar(stream, staged, self.uid, self.gid)
                    staged.seek(0)
                    ok = self.client.api.put_archive(self.container_id, self.workdir, staged)
        except UnsafeTar as exc:
            raise SandboxError(f"the workspace archive was refused: {exc}") from exc
        except (OSError, tarfile.TarError, docker.errors.DockerException) as exc:
            raise SandboxError(f"cannot copy workspace into the sandbox: {exc}") from exc
        if not ok:
            raise SandboxError("cannot copy workspace into the sandbox")

    def _new_seed(self) -> GitSeed | None:
        """pid's repository-to-be on the job disk (/.pid/git, root only; the control channel made it empty), for the
        unpacker to write the base's objects and index into; None if something is in it already (a second import:
        git makes that base)."""
        assert self._disk is not None
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        fds = [os.open(self._disk.path("pid"), flags)]
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
        return GitSeed(os.path.join(self._disk.path("pid"), "git"), deferred=self.uid != 0)

    def _record_base(self, timeout: float) -> None:
        seeded, self._seeded = self._seeded, False
        deferred = seeded and self._seed is not None
        self.base_commit = _commit(self.run_as_pid(base_script(self.workdir, seeded, deferred),
                                                   "recording the base commit", timeout))
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
            self._packing_error = f"cannot write the base commit's objects: {exc}"
            seed.discard()
        finally:
            try:
                os.unlink(spool)
            except OSError:
                pass

    def _wait_for_base(self) -> None:
        """The base's blobs are all in pid's repository (the deferred pack is written, an image's base recorded)."""
        for thread in (self._packing, self._recording):
            if thread is not None:
                thread.join()
        self._packing = self._recording = None
        if self._packing_error is not None:
            raise SandboxError(self._packing_error)

    def export_patch(self, dest: str, max_bytes: int, timeout: float = 600.0) -> PatchCopy:
        """Write the workspace's changes since the base commit to host file `dest` (made by pid's git, as root,
        from pid's repository; paths validated, size capped)."""
        if self.uid != 0:   # nothing of the agent may still run (swap files, hold FIFOs) while pid's git reads
            self._clear_process_table()
        if self._disk is not None:   # the room kept for an image's base (see _reserve)
            try:
                os.unlink(os.path.join(self._disk.path("pid"), RESERVE))
            except FileNotFoundError:
                pass
        try:
            self._wait_for_base()
        except SandboxError:
            if self._image_fs is None or self._image_fs.base is None:
                raise
            # An image's base, recorded while the agent worked, may have met a disk the agent filled: recorded
            # again now, from the same untouched view, into the room just freed.
            self._packing_error = None
            self.base_commit = self._record_image_base(self.run_as_pid, timeout)
        if self.base_commit is None:
            raise SandboxError("no base commit: import_workspace was not called")
        with self._out_dir_lock:   # the agent's outputs go (its processes are): pid's disk is the patch's
            if self._out_dir_fd is not None:
                self._kept.clear(self._out_dir_fd)
        room = f"{PID_DIR}/patch"
        self.run_as_pid(patch_script(self.workdir, self.base_commit, room), "making the patch", timeout)
        inside = f"{room}/patch.diff"
        try:
            chunks, _ = self.client.api.get_archive(self.container_id, inside)
            try:
                return copy_patch(chunks, dest, max_bytes)
            finally:
                chunks.close()
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot copy the patch out of the sandbox: {exc}") from exc

    def export_files(self, paths: list[str], dest_dir: str, budget: FilesBudget) -> tuple[list[str], list[Skipped]]:
        """Copy in-container files or directories into `dest_dir`, under their in-container paths; (host paths
        written, what was skipped and why). Limits and name checks: sandbox.artifacts."""
        os.makedirs(dest_dir, exist_ok=True)
        written: list[str] = []
        skipped: list[Skipped] = []
        for path in paths:
            try:
                chunks, _ = self.client.api.get_archive(self.container_id, self._abs(path))
            except docker.errors.NotFound:
                skipped.append(Skipped(path, "not found"))
                continue
            except docker.errors.DockerException as exc:
                raise SandboxError(f"cannot copy {path} out of the sandbox: {exc}") from exc
            # Keep the in-container path under dest_dir (files/workspace/a/out.txt) so equal names never collide.
            parent = posixpath.dirname(posixpath.normpath(self._abs(path))).lstrip("/")
            target = os.path.join(dest_dir, parent) if parent else dest_dir
            os.makedirs(target, exist_ok=True)
            try:
                copied = extract_files(chunks, target, max_bytes=budget.max_bytes, max_entries=budget.max_entries,
                                       budget=budget)
            finally:
                chunks.close()
            written.extend(copied.written)
            skipped.extend(copied.skipped)
        return written, skipped


def _commit(out: bytes) -> str:
    """The commit id a base script prints last."""
    return out.strip().splitlines()[-1].decode()


def _run_script(channel: Channel, script: str, what: str, timeout: float) -> bytes:
    channel.start(script, 16384, time.monotonic() + CONTROL_TIMEOUT_S)
    done = channel.finish(time.monotonic() + timeout)
    if done is None:   # its server waits for it and reads nothing meanwhile: drop the channel
        channel.broken = True
        raise SandboxError(f"{what} did not finish within {timeout:g}s")
    if done.exit_code != 0:
        detail = done.head.decode("utf-8", "replace").strip()[-2000:]
        raise SandboxError(f"{what} failed (exit {done.exit_code}): {detail}")
    return done.head


class _Tee:
    """A readable stream that copies what is read from it to `copy`."""

    def __init__(self, stream: IO[bytes], copy: IO[bytes]) -> None:
        self.stream, self.copy = stream, copy

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n)
        self.copy.write(data)
        return data


class DockerProvider:
    """pid.sandbox_lifecycle.SandboxProvider on a Docker engine: the runner makes its job's sandbox through this."""

    def __init__(self, client: docker.DockerClient | None = None) -> None:
        self.client = client   # None: connect from the environment at each create

    def create(self, config: SandboxConfig, workspace: IO[bytes] | None = None) -> DockerSandbox:
        return DockerSandbox.create(config, self.client, workspace)

    def clear_job(self, job_id: str) -> None:
        remove_job_containers(job_id, self.client)
