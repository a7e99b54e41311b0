"""Killing every process of the agent from outside the container, where nothing the agent does can get in the way.

Why from outside: a fork bomb keeps the process table full (so nothing new can start inside) and keeps the CPU
busy (so pid's own server inside, one task among hundreds under the CPU quota, barely runs). The engine freezes the
whole container (cgroup freezer: nothing runs, nothing forks), the host SIGKILLs every process of the agent's uid,
and the container thaws with only pid's machinery left; the host then waits until the killed have died. Where the
engine cannot freeze it (runc's cgroup v1 freezer gives up under a fork bomb on a loaded host), the host kills in
passes, each process held by a pidfd and checked to be the container's, until one finds nothing new. This needs the
worker to run as root on the engine's host, as the per-job disk does; elsewhere `kill_agent_processes` answers None
and the caller uses the in-container sweep.
"""
from __future__ import annotations

import functools
import logging
import os
import signal
import time
from dataclasses import dataclass

import docker
import docker.errors

log = logging.getLogger(__name__)

MAX_PROCESSES = 1 << 16    # a container's process list is read up to this many entries
FREEZE_ATTEMPTS = 3
UNFROZEN_SWEEP_S = 5.0     # how long passes over an unfrozen container's processes may go on


def read_small(path: str, limit: int = 1 << 20) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("ascii", "replace")


def cgroup_dir(init_pid: int, controller: str) -> str | None:
    """The host directory of the container's cgroup for `controller` (cgroup v1's, e.g. pids or memory; else v2's
    unified one), where it exists; from its first process's /proc/<pid>/cgroup (nothing in the container changes it).
    OSError if that process is gone."""
    for line in read_small(f"/proc/{init_pid}/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":                                   # cgroup v2
            candidate = f"/sys/fs/cgroup{path}"
        elif controller in controllers.split(","):
            candidate = f"/sys/fs/cgroup/{controller}{path}"
        else:
            continue
        if os.path.isdir(candidate):
            return candidate
    return None


def engine_cgroup_dirs(container_id: str, controller: str) -> list[str]:
    """Where the engine's cgroup drivers put a container's cgroup for `controller` (v1's, then v2's unified one),
    cgroupfs's and systemd's: looked at before the container's first process is asked for (an engine request)."""
    return [f"{root}/{name}" for root in (f"/sys/fs/cgroup/{controller}", "/sys/fs/cgroup")
            for name in (f"docker/{container_id}", f"system.slice/docker-{container_id}.scope")]


def _cgroup_procs_file(init_pid: int) -> str | None:
    """The host path of the cgroup.procs that holds the container's processes (cgroup v1 pids controller, or v2)."""
    where = cgroup_dir(init_pid, "pids")
    return None if where is None else os.path.join(where, "cgroup.procs")


TABLE_MARGIN = 8   # processes a command needs to start (as channel.sh's table_full)


class ProcessGauge:
    """How full a container's process table is, read on the host from its cgroup (nothing in the container can
    change these files). A command handed straight to a waiting shell has no server to refuse it when the table is
    full, so the host looks first (one read of an open file)."""

    def __init__(self, current_fd: int, limit: int | None) -> None:
        self._fd = current_fd
        self._limit = limit

    @classmethod
    def open(cls, container_id: str, init_pid: int | None = None) -> "ProcessGauge | None":
        """The gauge of a container by the engine's usual cgroup paths, else (given its first process) by where
        that process is; None if neither is readable."""
        dirs = engine_cgroup_dirs(container_id, "pids")
        if init_pid:
            try:
                procs = _cgroup_procs_file(init_pid)
            except (OSError, ValueError):
                procs = None
            if procs:
                dirs.insert(0, os.path.dirname(procs))
        for path in dirs:
            try:
                fd = os.open(os.path.join(path, "pids.current"), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                maximum = read_small(os.path.join(path, "pids.max")).strip()
                gauge = cls(fd, None if maximum == "max" else int(maximum))
                gauge.has_room()
                return gauge
            except (OSError, ValueError):
                os.close(fd)
        return None

    def has_room(self) -> bool:
        """Room for a command's processes: False when the table is (nearly) full. Raises OSError if unreadable."""
        if self._limit is None:
            return True
        return int(os.pread(self._fd, 32, 0)) + TABLE_MARGIN < self._limit

    def close(self) -> None:
        fd, self._fd = self._fd, -1   # (a reader racing this then fails on -1 rather than read a reused number)
        if fd >= 0:
            os.close(fd)


def _host_uid(init_pid: int, uid: int) -> int | None:
    """The container's uid as the host sees it (different under user-namespace remapping)."""
    for line in read_small(f"/proc/{init_pid}/uid_map").splitlines():
        inside, outside, count = (int(x) for x in line.split())
        if inside <= uid < inside + count:
            return outside + uid - inside
    return None


def _real_uid(pid: int) -> int | None:
    try:
        for line in read_small(f"/proc/{pid}/status", 8192).splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class Sweep:
    """What a clearing from the host did: the processes it killed (host pid, start time), whether the container is
    thawed again, and whether nothing of the agent's can be left."""
    killed: list[tuple[int, str]]
    cgroup_dir: str
    thawed: bool
    complete: bool = False   # every process of the agent's was seen killed (else the caller may not go on)

    def wait(self) -> int | None:
        """Wait (briefly) until the killed have died and the table has room again; then the forks the pids limit
        refused so far (the count pid's server reports too: those were the killed ones', or pid's own, starting
        meanwhile), None if unreadable. A SIGKILL sent to a frozen process acts only after the thaw, once the
        process gets the CPU: until then a waiting shell looks alive to pid's server inside, which would hand it the
        next command (that command then ends 137, never run)."""
        _wait_until_dead(self.killed)
        _wait_for_room(self.cgroup_dir)
        return _refused_forks(self.cgroup_dir)


def kill_agent_processes(client: docker.DockerClient, container_id: str, uid: int) -> Sweep | None:
    """SIGKILL every process of uid `uid` in the container, frozen first (else in passes from the host, which no CPU
    quota slows). None: not possible from here, or no process of the agent was seen (under gVisor the host sees only
    the runtime's own): the caller sweeps inside."""
    if os.geteuid() != 0:
        return None
    try:
        init_pid = int(client.api.inspect_container(container_id)["State"]["Pid"])
        procs = _cgroup_procs_file(init_pid) if init_pid > 0 else None
        host_uid = _host_uid(init_pid, uid) if procs else None
    except (OSError, ValueError, KeyError, docker.errors.DockerException) as exc:
        log.info("cannot sweep the container from the host: %s", exc)
        return None
    if procs is None or host_uid is None or host_uid == 0:
        return None
    frozen = _freeze(client, container_id)
    if not frozen and not _pidfds():   # (by number alone, one reused outside the container since could be hit)
        return None
    sweep = Sweep(killed=[], cgroup_dir=os.path.dirname(procs), thawed=not frozen)
    killed: set[tuple[int, str]] = set()
    seen: set[tuple[int, str]] = set()
    try:
        if not frozen:   # passes until one finds none: the host is not under the container's CPU quota, so it kills
            # faster than a starved bomb forks; then, the bomb gone, the freezer settles for a last look
            deadline = time.monotonic() + UNFROZEN_SWEEP_S
            while (left := _kill_pass(procs, host_uid, killed, seen, frozen)) and time.monotonic() < deadline:
                pass
            sweep.complete = not left
            frozen = _freeze(client, container_id, attempts=1)
            sweep.thawed = not frozen
        if frozen:
            _kill_pass(procs, host_uid, killed, seen, frozen)
            sweep.complete = True
    except (OSError, ValueError) as exc:
        log.warning("sweeping container %s from the host failed: %s", container_id[:12], exc)
        sweep.complete = False
    finally:
        sweep.killed = sorted(killed)
        for attempt in range(3 if frozen else 0):
            try:
                client.api.unpause(container_id)
                sweep.thawed = True
                break
            except docker.errors.DockerException as exc:
                log.warning("could not thaw container %s (attempt %d): %s", container_id[:12], attempt + 1, exc)
                time.sleep(0.2)
    # A frozen container goes back to the caller, whatever was killed: nothing may run in it (a docker exec started
    # into it would wedge the engine's shim). So does one whose agent may have outrun the sweep.
    return sweep if sweep.killed or not sweep.thawed or not sweep.complete else None


def _freeze(client: docker.DockerClient, container_id: str, attempts: int = FREEZE_ATTEMPTS) -> bool:
    """Pause the container; whether it is frozen. Under a fork bomb on a loaded host, cgroup v1's freezer may not
    settle in the time runc gives it ("unable to freeze"), nor with a process in uninterruptible sleep: it is tried
    again, briefly."""
    for attempt in range(attempts):
        try:
            client.api.pause(container_id)
            return True
        except docker.errors.DockerException as exc:
            log.warning("cannot freeze container %s (attempt %d): %s", container_id[:12], attempt + 1, exc)
            time.sleep(0.05)
    return False


@functools.cache
def _pidfds() -> bool:
    """Whether this kernel (and seccomp filter) gives pidfds."""
    try:
        os.close(os.pidfd_open(os.getpid()))
        return True
    except (AttributeError, OSError):
        return False


def _kill_pass(procs: str, host_uid: int, killed: set[tuple[int, str]], seen: set[tuple[int, str]],
               frozen: bool) -> int:
    """SIGKILL every live process of `host_uid` listed in `procs` (a cgroup.procs), added to `killed` (pid, start
    time); how many of the agent's it saw for the first time (`seen`: a zombie too, which may have forked before it
    ended), or that ended before they were looked at (one may have forked first: its child was not listed). One
    killed before and not yet dead is signalled again but not counted: with SIGKILL pending it cannot fork.
    Unfrozen, a process may end and its number go to another, even outside the container, between the list and the
    kill: each is held by a pidfd, then looked at (its uid, and its cgroup: the container's), and only that pidfd is
    signalled."""
    found = 0
    where = os.path.dirname(procs)
    for entry in read_small(procs, MAX_PROCESSES * 12).split()[:MAX_PROCESSES]:
        pid = int(entry)
        try:
            handle: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            found += 1
            continue
        except OSError:   # (no pidfds here: by number, which only a frozen container keeps from reuse)
            handle = None
        try:
            if handle is None and not frozen:
                found += 1
            elif (_real_uid(pid) == host_uid and (stat := _state_and_start(pid)) is not None
                  and (frozen or cgroup_dir(pid, "pids") == where)):
                if (pid, stat[1]) not in seen:
                    seen.add((pid, stat[1]))
                    found += 1
                if stat[0] != "Z":
                    if handle is None:
                        os.kill(pid, signal.SIGKILL)
                    else:   # (in a frozen container it acts once the container thaws)
                        signal.pidfd_send_signal(handle, signal.SIGKILL)
                    killed.add((pid, stat[1]))
        except ProcessLookupError:
            found += 1
        except OSError:   # (its /proc entry went with it)
            found += 1
        finally:
            if handle is not None:
                os.close(handle)
    return found


def _refused_forks(cgroup_dir: str) -> int | None:
    """pids.events' "max" count: how many forks the limit refused so far."""
    try:
        for line in read_small(os.path.join(cgroup_dir, "pids.events"), 4096).splitlines():
            name, _, count = line.partition(" ")
            if name == "max":
                return int(count)
    except (OSError, ValueError):
        pass
    return None


def _state_and_start(pid: int) -> tuple[str, str] | None:
    """A process's state and start time (fields 3 and 22 of /proc/<pid>/stat: the start time tells a reused pid
    apart), or None when it is gone."""
    try:
        text = read_small(f"/proc/{pid}/stat", 4096)
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _wait_until_dead(killed: list[tuple[int, str]], limit_s: float = 3.0) -> None:
    """Wait (briefly) until every killed process has died: a zombie or gone (or its pid reused)."""
    deadline = time.monotonic() + limit_s
    while killed and time.monotonic() < deadline:
        killed = [(pid, started) for pid, started in killed
                  if (now := _state_and_start(pid)) is not None and now[0] not in ("Z", "X") and now[1] == started]
        if killed:
            time.sleep(0.005)
    if killed:
        log.warning("%d killed processes still alive after %gs", len(killed), limit_s)


def _wait_for_room(cgroup_dir: str, limit_s: float = 3.0) -> None:
    """The killed are counted until the container's init reaps them: wait (briefly) until the table has room."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            current = int(read_small(os.path.join(cgroup_dir, "pids.current")))
            maximum = read_small(os.path.join(cgroup_dir, "pids.max")).strip()
        except (OSError, ValueError):
            return
        if maximum == "max" or current + 16 < int(maximum):
            return
        time.sleep(0.02)
