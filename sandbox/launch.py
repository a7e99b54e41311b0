"""Container launch: one hardened, labelled, self-expiring container per job, with its disks, and its removal.

What a container gets is decided here, once: the job's disk and pid's own (see PID_DISK), the image's writable trees
(image_fs.py), dropped capabilities, pid's seccomp profile, limits on memory, CPU, processes and open files, a time to
live and labels the reaper knows. The Container that comes back is created, not started: DockerSandbox starts it,
the workspace streaming onto its disk meanwhile.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import docker
import docker.errors
import requests.exceptions
from docker.types import Mount, Ulimit

from .channel import PID_DIR, RUN_DIR, Channel, PipeLink, entry_command
from .config import (AGENT_HOME, BASE_ENV, IMAGE_RUNS_NOTHING, LABEL_ATTEMPT, LABEL_CREATED, LABEL_EXPIRES,
                     LABEL_JOB, LABEL_OWNER, LABEL_POOL, SandboxConfig, parse_user)
from .disk import DiskError, JobDisk, disks_supported
from .docker_client import connect, ensure_image
from .errors import SandboxError
from .image_env import image_env, neutralised
from .image_fs import ImageFS, image_layers
from .reaper import force_remove, owner_label, remove_container, run_labels
from .seccomp import SECURITY_OPT
from .volumes import image_volumes

log = logging.getLogger(__name__)

PRESTARTED = (("control", 1), ("agent", 2), ("agent", 3))   # the servers the container's entry starts (role, id)
FIFO_RUNTIMES = ("runc", "io.containerd.runc.v2")   # runtimes whose containers open the host's FIFOs
# and share the host's kernel. Any other runtime (gVisor's runsc) runs a kernel of its own: the pids cgroup then
# counts the runtime's host tasks, not the agent's processes (gVisor's ptrace platform spends about 8-12 host tasks
# on each process it runs, and dies when the cgroup refuses it one). There the agent's processes are bounded by
# RLIMIT_NPROC, which that kernel counts per sandbox, and the cgroup gets room for what the runtime spends on them.
HOST_TASKS_PER_GUEST_PROCESS = 12
RUNTIME_HOST_TASKS = 256
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
# No network (--network none): the engine's own "none" costs a container start about as much as all the rest (its
# network library prepares the empty namespace, running dockerd again as a hook): with pid's disk there, the engine
# is told the container has no network at all, and runc makes the empty namespace itself (its loopback up), twice as
# fast here. /etc/hosts, which the engine writes only for a network of its own, is then pid's: the engine's words
# for no network, in a file of the job's own on the job's disk, read-only in the container (as the engine's is with
# a read-only root).
ETC_HOSTS = ("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n"
             "ff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n")
HOSTS_FILE = "hosts"   # at the root of the job's disk

# pid's in-container machinery runs as root with only these capabilities; the agent (another uid) gets none:
#   SETUID, SETGID  setpriv drops each agent command to the agent's uid and gid
#   SETPCAP         ... and empties its capability bounding set
#   KILL            signal the agent's processes (timeouts, cancel, a full process table)
#   CHOWN           give the workspace and home to the agent's uid at start
#   DAC_READ_SEARCH git reads every workspace file for the patch, whatever modes the agent set
MACHINERY_CAPABILITIES = ["SETUID", "SETGID", "SETPCAP", "KILL", "CHOWN", "DAC_READ_SEARCH"]
# With `--user root` the agent shares pid's uid; it also gets what root is expected to do in its own workspace.
ROOT_AGENT_CAPABILITIES = ["DAC_OVERRIDE", "FOWNER", "FSETID", "NET_BIND_SERVICE"]

# A start the engine itself fails (a 5xx: containerd's shim timing out on a loaded host, "opening w/o fifo ...
# context deadline exceeded") is tried again: the container is still only created, its disks and its servers' FIFOs
# as they were. Anything else fails at once.
START_ATTEMPTS = 3
START_PAUSE_S = 1.0

NOFILE_MAX = 8192          # below the engine's own limit on common hosts (runc refuses to raise it)
FILE_TABLE_SHARE = 8       # one job's processes x open files stay under 1/8 of the host's file table



def agent_env(uid: int) -> dict[str, str]:
    """The environment of pid's servers in the container, and so of the agent's commands."""
    return dict(BASE_ENV, USER="root" if uid == 0 else "agent")


def start_created(client: docker.DockerClient, cid: str, failed: str,
                  given_up: Callable[[], bool] = lambda: False, again: Callable[[], None] = lambda: None) -> None:
    """Start a created container, trying an engine's own failure again (START_ATTEMPTS) unless `given_up()`, after
    `again()` (the engine ends what was attached to the container when a start fails); raises
    SandboxError("<failed>: <the engine's words>") when it cannot."""
    for attempt in range(1, START_ATTEMPTS + 1):
        if attempt > 1:
            again()
        try:
            client.api.start(cid)
            return
        except docker.errors.DockerException as exc:
            server_error = isinstance(exc, docker.errors.APIError) and exc.is_server_error()
            if not server_error or attempt == START_ATTEMPTS or given_up():
                raise SandboxError(f"{failed}: {exc}") from exc
            log.warning("the engine failed to start container %s (attempt %d of %d), trying again: %s",
                        cid[:12], attempt, START_ATTEMPTS, exc)
            time.sleep(START_PAUSE_S)


_default_runtimes: dict[str, str] = {}
_asking_runtime = threading.Lock()


def default_runtime(client: docker.DockerClient) -> str:
    """The engine's default runtime (asked once per engine and process: dockerd must restart to change it). A burst's
    jobs, all starting at once, wait for the one answer: each /info costs the engine two processes (`runc
    --version`, `docker-init --version`) as it starts their containers."""
    url = str(client.api.base_url)
    with _asking_runtime:
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


def free_reserve(disk: JobDisk | None) -> None:
    """The room kept for an image's base is freed (as the patch is made: see _reserve)."""
    if disk is not None:
        try:
            os.unlink(os.path.join(disk.path("pid"), RESERVE))
        except FileNotFoundError:
            pass


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
    """The job's disk (`layout`, plus the mount points of pid's disk in its /.pid) and pid's own disk, made at the
    same time: each is mostly mkfs and mount, other processes (one after the other, they took ~0.1 s more of a job's
    start). On any failure neither is left."""
    root, name = config.disk_root or default_disk_root(), f"{config.job_id}-{os.urandom(3).hex()}"
    layout = {**layout, **{f"pid/{sub}": (0, 0, 0o700) for sub in PID_DISK_DIRS}}
    made: list[JobDisk | BaseException] = []

    def make_pid_disk() -> None:
        try:
            made.append(JobDisk.create(root, name + "-pid", PID_DISK,
                                       layout={sub: (0, 0, mode) for sub, mode in PID_DISK_DIRS.items()}))
        except BaseException as exc:   # handed to the caller's thread, below
            made.append(exc)

    beside = threading.Thread(target=make_pid_disk, name="pid-disk", daemon=True)
    beside.start()
    try:
        disk = JobDisk.create(root, name, config.disk, layout=layout)
    except BaseException as exc:
        beside.join()   # (bounded: every step of a disk's making has its timeout)
        _close_disks(*(d for d in made if isinstance(d, JobDisk)))
        if isinstance(exc, DiskError):
            raise SandboxError(f"cannot make the job's disk: {exc}") from exc
        raise
    beside.join()
    pid_disk = made[0]
    if isinstance(pid_disk, JobDisk):
        return disk, pid_disk
    disk.close()
    if isinstance(pid_disk, DiskError):
        raise SandboxError(f"cannot make pid's own disk: {pid_disk}") from pid_disk
    raise pid_disk


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



@dataclass
class Container:
    """One job's container, created, and what the host holds for it: its disks, the image's writable trees, the
    channels of the servers its entry starts. remove() ends the container; release() then frees the host's side."""
    client: docker.DockerClient
    config: SandboxConfig
    image_id: str              # the image it runs, by id (a tag may move meanwhile; result.json says which)
    env: dict[str, str]        # pid's servers' environment, and so the agent's (an exec adds it to the image's)
    uid: int
    gid: int
    id: str = ""
    disk: JobDisk | None = None
    pid_disk: JobDisk | None = None   # pid's own (see PID_DISK); there whenever the job's disk is
    image_fs: ImageFS | None = None
    runtime: str = "unknown"   # the engine's runtime it runs under (runc, runsc...), as launch found it
    first: list[Channel] = field(default_factory=list)   # the entry's servers (PRESTARTED), not yet greeted
    removed_by_pid: bool = False   # kill() removed it (or tried): it is gone on purpose
    storage: dict[str, Any] = field(default_factory=dict)   # its filesystem's options (_storage): the disks' mounts
    owns_client: bool = False   # launch made the client for it: release() closes it (a caller's stays the caller's)
    released: bool = False   # release() ran: is_alive, kill and remove ask the engine nothing more, nor does a new
    # channel (a late thread's request would open a connection on the closed client, left until a garbage collection)
    _killing: threading.Lock = field(init=False, default_factory=threading.Lock, repr=False, compare=False)

    @property
    def host_kernel(self) -> bool:
        """The runtime is one of FIFO_RUNTIMES: the container opens the host's FIFOs, and what it writes on a disk of
        pid's is the host's file at once (gVisor's writes may wait in its own page cache)."""
        return self.runtime in FIFO_RUNTIMES

    @property
    def own_kernel(self) -> bool:
        """The runtime is known to run a kernel of its own (see FIFO_RUNTIMES; under runc, NPROC would count the
        agent uid's processes in every container)."""
        return self.runtime != "unknown" and not self.host_kernel

    def start(self) -> None:
        """Start the created container (see START_ATTEMPTS)."""
        start_created(self.client, self.id, f"cannot start sandbox container from {self.config.image!r}",
                      given_up=lambda: self.released)

    def is_alive(self) -> bool:
        """The container exists and runs (one engine request)."""
        if self.released:
            return False
        try:
            state = self.client.api.inspect_container(self.id).get("State", {})
        except docker.errors.NotFound:
            return False
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return True   # the engine is slow or busy: not evidence that the container is gone
        return bool(state.get("Running")) and not state.get("Dead")

    def oom_killed(self) -> bool:
        """The engine says the kernel killed the container's first process (or gVisor's sandbox) for memory."""
        try:
            return bool(self.client.api.inspect_container(self.id).get("State", {}).get("OOMKilled"))
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return False

    def init_pid(self) -> int | None:
        """The host's pid of the container's init, or None when the engine does not say."""
        try:
            return int(self.client.api.inspect_container(self.id)["State"]["Pid"]) or None
        except (docker.errors.DockerException, requests.exceptions.RequestException, KeyError, ValueError):
            return None

    def kill(self) -> None:
        """Force-remove the container now, from any thread (the watchdog's tool). One gone already, or going (the
        kernel's memory kill ended it, someone removed it), was not removed by pid: what it left may be collected."""
        with self._killing:
            if self.released:   # (removed, and what the host held for it freed)
                return
            if self.removed_by_pid:
                force_remove(self.client, self.id)
                return
            self.removed_by_pid = True   # (first: a channel that breaks meanwhile is read as pid's doing)
            if remove_container(self.client, self.id) in ("gone", "going"):
                self.removed_by_pid = False

    def remove(self) -> None:
        """Force-remove the container; never raises."""
        if not self.released:
            force_remove(self.client, self.id)

    def release(self) -> None:
        """Once the container is removed: the host's side goes (the disks, the image's trees). Never raises."""
        for channel in self.first:   # (not taken: the container never started)
            channel.close()
        self.first = []
        if self.disk is not None and self.id:
            self._wait_gone(10.0)     # the bind mounts hold the disk busy until the container is really gone
        if self.image_fs is not None:
            self.image_fs.close()
        _close_disks(self.disk, self.pid_disk)
        self.released = True
        if self.owns_client:   # (its connections to the engine go now, not at a garbage collection)
            self.owns_client = False
            self.client.close()

    def _wait_gone(self, limit_s: float) -> None:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            try:
                self.client.api.inspect_container(self.id)
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                return   # NotFound: gone; anything else (an engine busy past its timeout): nothing better to wait for
            time.sleep(0.05)


def launch(config: SandboxConfig, client: docker.DockerClient | None = None) -> Container:
    """Create the job's container, not started. Raises ImageNotFound / DockerUnavailable / SandboxError (also for a
    disk limit that cannot be applied); on any failure nothing of it is left."""
    uid, gid = parse_user(config.user)
    owned = client is None
    client = connect(client)
    try:
        inspected = ensure_image(config.image, client)
    except BaseException:
        if owned:
            client.close()
        raise
    now = datetime.now(timezone.utc)
    box = Container(client, config, str(inspected.get("Id") or config.image),   # (its id from here on)
                    {**agent_env(uid), **neutralised(image_env(inspected))}, uid, gid, owns_client=owned)
    try:
        box.storage = options = _storage(box, inspected)
        box.runtime = config.runtime or default_runtime(client)
        ttl = max(1, int(config.ttl_s))
        command = ["sleep", str(ttl)]   # exits (and is auto-removed) by itself when orphaned
        # The control server and two agent servers start with the container, on FIFOs of pid's disk (see
        # channel.PipeLink): under runc only (gVisor, for one, keeps the host's FIFOs out of its sandbox), whether
        # named or the engine's default.
        if box.pid_disk is not None and box.host_kernel:
            box.first = _first_channels(box.pid_disk.path(RUN_DIR))
            command = entry_command(ttl, list(PRESTARTED), config.workdir, uid, gid)
        box.id = _create(box, command, now, ttl, options)
    except BaseException:
        box.release()
        raise
    return box


def launch_on_disks_of(gone: Container) -> Container:
    """A fresh container, not started, on the disks of one that is gone (the kernel's memory kill took it down, or
    someone removed it): the same image, hardening, limits, labels and mounts, and nothing of the agent's running, so
    that pid's own work on what the agent left (the patch, the files) can still be done. Its servers start through
    the engine (`docker exec`). The disks stay `gone`'s until the caller hands them over (take_disks)."""
    if gone.disk is None:
        raise SandboxError("the container had no disk of its own: nothing of it is left to collect")
    box = replace(gone, id="", first=[], removed_by_pid=False, released=False)
    ttl = max(1, int(gone.config.ttl_s))
    box.id = _create(box, ["sleep", str(ttl)], datetime.now(timezone.utc), ttl, gone.storage)
    return box


def take_disks(gone: Container) -> None:
    """What the host held for `gone` (its disks, the image's trees) is the container launch_on_disks_of made on them
    from now on: that one's release frees them, `gone`'s no longer does."""
    gone.disk = gone.pid_disk = gone.image_fs = None
    gone.owns_client = False   # (the fresh one shares its client, and closes it)


def _storage(box: Container, inspected: dict[str, Any]) -> dict[str, Any]:
    """The container's filesystem options: the job's disk and pid's bound in (box.disk, box.pid_disk), the image's
    writable trees (box.image_fs), read-only root; else the engine's quota. The caller releases them on failure."""
    config, uid, gid = box.config, box.uid, box.gid
    if not config.disk:
        if config.writable_image:
            raise SandboxError("--workdir needs the job's own disk: pass a --disk size other than 0")
        return {}
    reason = disks_supported()
    if reason is not None:
        if config.writable_image:
            raise SandboxError(f"--workdir needs the job's own disk, and {reason or 'there is none (--disk 0)'}")
        return {"storage_opt": {"size": str(config.disk)}}   # the engine's own quota (overlay2 on xfs, pquota)
    layout = {"workspace": (uid, gid, 0o755), "home": (uid, gid, 0o755), "tmp": (0, 0, 0o1777),
              "vartmp": (0, 0, 0o1777), "pid": (0, 0, 0o711), "pid/git": (0, 0, 0o700)}
    if config.writable_image:
        layout.update({"image": (0, 0, 0o700), "pid/base": (0, 0, 0o700)})
    volumes = image_volumes(inspected, config.image, ("/tmp", "/var/tmp", AGENT_HOME, PID_DIR, config.workdir))
    if volumes:
        layout.update({"volumes": (0, 0, 0o755),
                       **{f"volumes/{n}": (v.uid, v.gid, v.mode) for n, v in enumerate(volumes)}})
    box.disk, box.pid_disk = disk, pid_disk = _make_disks(config, layout)
    own = [(AGENT_HOME, "home"), ("/tmp", "tmp"), ("/var/tmp", "vartmp"), (PID_DIR, "pid")]
    if not config.image_workspace:
        own.insert(0, (config.workdir, "workspace"))
    mounts = [Mount(target, disk.path(name), type="bind") for target, name in own]
    mounts += [Mount(f"{PID_DIR}/{sub}", pid_disk.path(sub), type="bind") for sub in PID_DISK_DIRS]
    if config.network == "none":
        try:
            mounts.append(Mount("/etc/hosts", _hosts_file(disk), type="bind", read_only=True))
        except OSError as exc:
            raise SandboxError(f"cannot write the container's /etc/hosts on the job's disk: {exc}") from exc
    if config.writable_image:
        try:
            _reserve(disk, config.disk)
            box.image_fs = ImageFS.build(image_layers(inspected, config.image), disk.path("image"),
                                         workdir=config.workdir, uid=uid, gid=gid,
                                         image_workspace=config.image_workspace, taken={target for target, _ in own},
                                         init_binary=engine_init(box.client) if uid == 0 else None)
        except OSError as exc:
            raise SandboxError(f"cannot make the image's filesystem writable: {exc}") from exc
        mounts += [Mount(tree.target, tree.source, type="bind", read_only=tree.read_only)
                   for tree in box.image_fs.mounts()]
    taken = {mount["Target"] for mount in mounts}   # (a volume where pid mounts a tree already is that tree)
    mounts += [Mount(v.target, disk.path(f"volumes/{n}"), type="bind")
               for n, v in enumerate(volumes) if v.target not in taken]
    return {"read_only": True, "mounts": mounts}


def _hosts_file(disk: JobDisk) -> str:
    """The container's /etc/hosts, on the job's disk (see ETC_HOSTS)."""
    path = disk.path(HOSTS_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o644)   # (whatever the umask)
        f.write(ETC_HOSTS)
    return path


def _create(box: Container, command: list[str], now: datetime, ttl: int, options: dict[str, Any]) -> str:
    """The engine creates the container, hardened and limited; its id."""
    config, uid = box.config, box.uid
    caps = MACHINERY_CAPABILITIES + (ROOT_AGENT_CAPABILITIES if uid == 0 else [])
    nofile = nofile_limit(config.pids_limit)
    ulimits = [Ulimit(name="nofile", soft=nofile, hard=nofile)]
    host_tasks = config.pids_limit
    if box.own_kernel:   # (see FIFO_RUNTIMES)
        ulimits.append(Ulimit(name="nproc", soft=config.pids_limit, hard=config.pids_limit))
        host_tasks = config.pids_limit * HOST_TASKS_PER_GUEST_PROCESS + RUNTIME_HOST_TASKS
    try:
        container = box.client.containers.create(
            box.image_id, command, environment=box.env,
            auto_remove=True, init=True, user="0:0",
            **IMAGE_RUNS_NOTHING,
            log_config={"type": "none"},   # nothing of the container's is logged by the engine (nor fills its disk)
            labels={LABEL_JOB: config.job_id, LABEL_CREATED: _iso(now),
                    LABEL_EXPIRES: _iso(now + timedelta(seconds=ttl)),
                    LABEL_OWNER: config.owner or owner_label(_pid_home()),
                    LABEL_ATTEMPT: str(config.attempt), **({LABEL_POOL: config.pool} if config.pool else {}),
                    **run_labels()},
            mem_limit=config.memory, memswap_limit=config.memory,
            nano_cpus=int(config.cpus * 1e9), pids_limit=host_tasks,
            network_mode=config.network,
            network_disabled=box.disk is not None and config.network == "none",   # (see ETC_HOSTS)
            security_opt=SECURITY_OPT,   # (no-new-privileges, and pid's seccomp profile: seccomp.py)
            cap_drop=["ALL"], cap_add=caps,
            ulimits=ulimits,
            working_dir=config.workdir, runtime=config.runtime or None,
            **options)
    except docker.errors.DockerException as exc:
        if "storage_opt" in options:
            raise SandboxError(
                f"cannot limit the job's disk: {disks_supported()}, and the engine refused a disk quota "
                f"({exc}); run the worker as root, or pass --disk 0 for no limit") from exc
        why = getattr(exc, "explanation", None) or exc   # the engine's own words, without its request
        raise SandboxError(f"cannot create sandbox container from {config.image!r}: {why}") from exc
    return str(container.id)
