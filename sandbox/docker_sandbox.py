"""`pid.sandbox.Sandbox` on Docker: one hardened, labelled, self-expiring container per task.

Commands, reads and writes go through a pool of exec channels (see channel.py): no `docker exec` per call.
Files cross the host boundary only as tar streams, built and extracted without following links.
"""
from __future__ import annotations

import itertools
import logging
import os
import posixpath
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping

import docker
import docker.errors
from docker.types import Ulimit

from pid.sandbox import ExecResult

from .channel import Channel, ChannelClosed, install_script
from .config import LABEL_CREATED, LABEL_EXPIRES, LABEL_JOB, SandboxConfig
from .docker_client import connect, ensure_image
from .errors import SandboxError
from .pool import ChannelPool
from .workspace import BASE_SCRIPT, PATCH_SCRIPT, build_tar, copy_single_member, extract_safely

log = logging.getLogger(__name__)

MAX_CHANNELS = 8
OUTPUT_POLL_S = 0.75       # on_output cadence
OUTPUT_CHUNK = 16384       # at most this much of the newest output per on_output call
CANCEL_POLL_S = 0.1        # how often a waiting exec looks at its cancel Event
KILL_GRACE_S = 10.0        # after SIGKILL, the server must report the end within this

# What an agent needs as root in its own workspace: own/chmod files, switch users, signal its processes,
# bind low ports on loopback. Everything else (mknod, raw sockets, chroot, setfcap, audit...) is dropped.
KEEP_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "NET_BIND_SERVICE"]
NOFILE = 8192             # below the engine's own limit on common hosts (runc refuses to raise it)


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class DockerSandbox:
    """Implements pid.sandbox.Sandbox. Thread-safe: concurrent calls use separate channels."""

    def __init__(self, client: docker.DockerClient, container_id: str, config: SandboxConfig) -> None:
        self.client = client
        self.container_id = container_id
        self.config = config
        self.workdir = config.workdir
        self.base_commit: str | None = None
        self._channel_ids = itertools.count(1)
        self._pool = ChannelPool(self._new_channel, MAX_CHANNELS)
        self._running: dict[int, bool] = {}   # pgid -> killed by kill_all
        self._lock = threading.Lock()
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, config: SandboxConfig, client: docker.DockerClient | None = None) -> "DockerSandbox":
        """Start the container and one warm channel. Raises ImageNotFound / DockerUnavailable / SandboxError."""
        client = connect(client)
        ensure_image(config.image, client)
        now = datetime.now(timezone.utc)
        ttl = max(1, int(config.ttl_s))
        try:
            container = client.containers.create(
                config.image, ["sleep", str(ttl)],   # exits (and is auto-removed) by itself when orphaned
                auto_remove=True, init=True,
                labels={LABEL_JOB: config.job_id, LABEL_CREATED: _iso(now),
                        LABEL_EXPIRES: _iso(now + timedelta(seconds=ttl))},
                mem_limit=config.memory, memswap_limit=config.memory,
                nano_cpus=int(config.cpus * 1e9), pids_limit=config.pids_limit,
                network_mode=config.network,
                security_opt=["no-new-privileges"],
                cap_drop=["ALL"], cap_add=KEEP_CAPABILITIES,
                ulimits=[Ulimit(name="nofile", soft=NOFILE, hard=NOFILE)],
                working_dir=config.workdir,
            )
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot create sandbox container from {config.image!r}: {exc}") from exc
        try:
            container.start()
        except docker.errors.DockerException as exc:
            try:
                container.remove(force=True)
            except docker.errors.DockerException:
                pass
            raise SandboxError(f"cannot start sandbox container from {config.image!r}: {exc}") from exc
        sandbox = cls(client, container.id, config)
        try:
            install_script(client.api, container.id)
            sandbox._pool.release(sandbox._pool.acquire())   # one warm channel now...
            # ...and a second in the background, so the first parallel batch of tool calls pays no docker exec
            threading.Thread(target=sandbox._pool.grow, name="pid-channel-warmup", daemon=True).start()
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    def _new_channel(self) -> Channel:
        return Channel(self.client.api, self.container_id, next(self._channel_ids), self.workdir)

    def close(self) -> None:
        """Remove the container (forced). Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        try:
            self._pool.close()
        except Exception:
            pass
        try:
            self.client.api.remove_container(self.container_id, force=True)
        except docker.errors.NotFound:
            pass
        except Exception as exc:  # 409 "removal already in progress" (auto_remove) is fine too
            if getattr(exc, "status_code", None) != 409:
                log.warning("could not remove sandbox container %s: %s", self.container_id[:12], exc)

    def __enter__(self) -> "DockerSandbox":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- the Sandbox protocol ---------------------------------------------------------------------------------
    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else posixpath.join(self.workdir, path)

    def _with_channel(self, fn: Callable[[Channel], Any]) -> tuple[Channel, Any]:
        """(channel, fn(channel)) on a pooled channel that stays lent to the caller. A dead idle channel (its server
        was killed) is replaced and fn retried: a dead server ran nothing, so every request is safe to retry."""
        for attempt in range(MAX_CHANNELS + 1):
            channel = self._pool.acquire()
            try:
                return channel, fn(channel)
            except ChannelClosed:
                self._pool.discard(channel)
                if attempt == MAX_CHANNELS:
                    raise
            except BaseException as exc:
                if isinstance(exc, OSError) and not channel.broken:   # FileNotFoundError & co: channel is fine
                    self._pool.release(channel)
                else:
                    self._pool.discard(channel)
                raise
        raise AssertionError("unreachable")

    def _call(self, fn: Callable[[Channel], Any]) -> Any:
        channel, result = self._with_channel(fn)
        self._pool.release(channel)
        return result

    def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        return self._call(lambda channel: channel.read_file(self._abs(path), max_bytes))

    def write_file(self, path: str, data: bytes) -> None:
        self._call(lambda channel: channel.write_file(self._abs(path), bytes(data)))

    def exec(self, command: str, *, timeout: float, tail_bytes: int = 65536,
             keep_lines: int | None = None, keep_bytes: int | None = None,
             env: Mapping[str, str] | None = None,
             on_output: Callable[[bytes], None] | None = None,
             cancel: threading.Event | None = None) -> ExecResult:
        started = time.monotonic()
        channel, pgid, out_path = self._start(command, env, tail_bytes, keep_lines, keep_bytes)
        try:
            with self._lock:
                self._running[pgid] = False
            deadline = started + timeout
            next_poll = started + OUTPUT_POLL_S
            polled = 0
            stop: str | None = None
            while True:
                now = time.monotonic()
                if cancel is not None and cancel.is_set():
                    stop = "cancelled"
                    break
                if now >= deadline:
                    stop = "timed_out"
                    break
                wake = deadline
                if cancel is not None:
                    wake = min(wake, now + CANCEL_POLL_S)
                if on_output is not None:
                    if now >= next_poll:
                        polled = self._poll_output(out_path, polled, on_output)
                        next_poll = time.monotonic() + OUTPUT_POLL_S
                    wake = min(wake, next_poll)
                reply = channel.wait_exec(wake)
                if reply is not None:
                    break
            if stop is not None:
                self._kill_group(pgid)
                reply = channel.wait_exec(time.monotonic() + KILL_GRACE_S)
                if reply is None:
                    raise SandboxError(f"command did not end after SIGKILL of its process group {pgid}")
            with self._lock:
                killed_by_kill_all = self._running.pop(pgid, False)
            pgid = None
        except BaseException:
            if pgid is not None:   # interrupted while the command runs: it must not outlive us
                try:
                    self._kill_group(pgid)
                except Exception:
                    pass
                with self._lock:
                    self._running.pop(pgid, None)
            self._pool.discard(channel)
            raise
        self._pool.release(channel)
        if killed_by_kill_all and stop is None:
            stop = "cancelled"
        return ExecResult(
            exit_code=None if stop else reply.exit_code, tail=reply.tail, total_bytes=reply.total_bytes,
            total_lines=reply.total_lines, timed_out=stop == "timed_out", cancelled=stop == "cancelled",
            output_path=reply.kept_path)

    # -- helpers for exec ----------------------------------------------------------------------------------------
    def _start(self, command: str, env: Mapping[str, str] | None, tail_bytes: int,
               keep_lines: int | None, keep_bytes: int | None) -> tuple[Channel, int, str]:
        """Start the command on a channel, which stays lent until the command's reply is read."""
        channel, (pgid, out_path) = self._with_channel(
            lambda ch: ch.start_exec(command, env, tail_bytes, keep_lines, keep_bytes))
        return channel, pgid, out_path

    def _poll_output(self, out_path: str, offset: int, on_output: Callable[[bytes], None]) -> int:
        """Hand output appended since `offset` to on_output, through a spare channel if one is free."""
        channel = self._pool.acquire(block=False)
        if channel is None:
            return offset
        try:
            size, chunk = channel.tail(out_path, offset, OUTPUT_CHUNK)
        except BaseException:
            self._pool.discard(channel)
            raise
        self._pool.release(channel)
        if chunk:
            on_output(chunk)
        return max(offset, size)

    def _kill_group(self, pgid: int) -> None:
        """SIGKILL a process group inside the container: via a free channel, or a one-off exec if none is."""
        channel = self._pool.acquire(block=False)
        if channel is not None:
            try:
                channel.kill(pgid)
            except ChannelClosed:
                self._pool.discard(channel)   # dead spare channel: use the one-off exec below
            except BaseException:
                self._pool.discard(channel)
                raise
            else:
                self._pool.release(channel)
                return
        try:
            self.client.api.exec_start(self.client.api.exec_create(
                self.container_id, ["/bin/sh", "-c", f"kill -9 -{pgid} 2>/dev/null || kill -9 {pgid}"])["Id"])
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot kill process group {pgid}: {exc}") from exc

    def kill_all(self) -> None:
        """Kill every running command's process group; their exec calls return with cancelled=True."""
        with self._lock:
            pgids = list(self._running)
            for pgid in pgids:
                self._running[pgid] = True
        for pgid in pgids:
            try:
                self._kill_group(pgid)
            except SandboxError as exc:
                log.warning("kill_all: %s", exc)

    # -- workspace in, results out -----------------------------------------------------------------------------
    def _run_checked(self, script: str, what: str, timeout: float = 600.0) -> bytes:
        result = self.exec(script, timeout=timeout, tail_bytes=16384)
        if result.exit_code != 0:
            detail = result.tail.decode("utf-8", "replace").strip()[-2000:]
            raise SandboxError(f"{what} failed (exit {result.exit_code}): {detail}")
        return result.tail

    def import_workspace(self, host_path: str) -> None:
        """Copy a host directory into workdir and commit it inside as the base of the patch.

        The host directory is only read (never followed through links, never touched by git).
        """
        with build_tar(host_path) as spool:
            try:
                ok = self.client.api.put_archive(self.container_id, self.workdir, spool)
            except docker.errors.DockerException as exc:
                raise SandboxError(f"cannot copy workspace into the sandbox: {exc}") from exc
        if not ok:
            raise SandboxError("cannot copy workspace into the sandbox")
        out = self._run_checked(BASE_SCRIPT, "recording the base commit")
        self.base_commit = out.strip().splitlines()[-1].decode()

    def export_patch(self, dest: str) -> int:
        """Write `git diff --binary` of the workspace against the base commit to host file `dest`; its size."""
        if self.base_commit is None:
            raise SandboxError("no base commit: import_workspace was not called")
        inside = "/tmp/.pid/patch.diff"
        self._run_checked(PATCH_SCRIPT.format(base=self.base_commit, dest=inside), "making the patch")
        try:
            chunks, _ = self.client.api.get_archive(self.container_id, inside)
            return copy_single_member(chunks, dest)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot copy the patch out of the sandbox: {exc}") from exc

    def export_files(self, paths: list[str], dest_dir: str) -> list[str]:
        """Copy in-container files or directories into `dest_dir`; returns the host paths of those copied.

        Missing paths are skipped. Extraction uses tarfile's "data" filter; members it refuses (absolute
        or escaping links, `..`, devices) are skipped, so nothing outside dest_dir is written or followed.
        """
        os.makedirs(dest_dir, exist_ok=True)
        copied = []
        for path in paths:
            try:
                chunks, _ = self.client.api.get_archive(self.container_id, self._abs(path))
            except docker.errors.NotFound:
                log.info("export_files: %s does not exist in the sandbox", path)
                continue
            except docker.errors.DockerException as exc:
                raise SandboxError(f"cannot copy {path} out of the sandbox: {exc}") from exc
            # Keep the in-container path under dest_dir (files/workspace/a/out.txt) so equal names never collide.
            target = os.path.join(dest_dir, posixpath.dirname(posixpath.normpath(self._abs(path))).lstrip("/"))
            os.makedirs(target, exist_ok=True)
            written = extract_safely(chunks, target)
            if written:
                copied.append(written[0])
        return copied
