"""The exec channels of one container: a pool of agent channels and the control channel (pid's own, as root).

Commands, reads and writes go through pooled channels (see channel.py): no `docker exec` per call. The container's
entry starts the control server and two agent servers on FIFOs of pid's disk (launch.PRESTARTED); they are greeted
here, and replaced through the engine when they do not answer. A separate control channel does pid's own work as
root (kills, the base commit, the patch), where the agent, which runs as another uid with no capabilities, cannot
reach it.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any, Callable

from pid.sandbox_api import SandboxLost

from .channel import Channel, ChannelClosed, SetupFailed
from .errors import SandboxError
from .launch import PRESTARTED, Container
from .pool import ChannelPool

log = logging.getLogger(__name__)

MAX_CHANNELS = 8
PRESTARTED_HELLO_S = 10.0   # for one of them to answer; past it (or on any error) pid starts one with `docker exec`
CONTROL_TIMEOUT_S = 30.0    # a control request (kill, poll) must be answered within this


class ExecChannels:
    """The channels into one container. Thread-safe: concurrent callers get separate agent channels; the control
    channel serves one caller at a time."""

    def __init__(self, container: Container) -> None:
        self.container = container
        first, container.first = container.first, []   # (ours from here on)
        self._ids = itertools.count(PRESTARTED[-1][1] + 1 if first else 1)
        self._control: Channel | None = first[0] if first else None
        self._control_lock = threading.Lock()
        self._adrift: set[int] = set()   # process groups of pid's scripts that may still run (run_script)
        self._prestarted: list[Channel] = first[1:]   # agent servers the entry started, not yet pooled
        self._prestarted_lock = threading.Lock()
        self._pool = ChannelPool(self._new_channel, MAX_CHANNELS)
        self.shell = "bash"
        # A container frozen while `docker exec` starts a process in it wedges the engine's shim for good (runc's
        # init freezes half-way): starting a channel and freezing the container exclude each other.
        self.exec_gate = threading.Lock()

    # -- starting ---------------------------------------------------------------------------------------------
    def start_control(self) -> int:
        """Once the container runs: the control channel answers (the entry's, else one through the engine); the
        forks the pids limit refused so far, as its server counts them."""
        if self._control is not None:   # started with the container: greet them all, await the control's
            self._greet_prestarted()
        if self._control is None:
            self._control = self._open_channel("control")
        self.shell = self._control.shell
        return self._control.pids_events

    def warm_up(self, count: int) -> None:
        """Agent channels ready before the first tool call: the entry's servers greeted, else new ones. Callers
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
                channel.send_hello(time.monotonic() + PRESTARTED_HELLO_S, self._host_outputs(channel.role))
            self._control.await_hello(time.monotonic() + PRESTARTED_HELLO_S, alive=self.container.is_alive)
        except SetupFailed:
            raise   # (a server through the engine would say the same)
        except Exception as exc:
            log.warning("sandbox %s: its first servers did not answer (%s); starting them with docker exec",
                        self.container.id[:12], exc)
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
            channel.await_hello(time.monotonic() + PRESTARTED_HELLO_S, alive=self.container.is_alive)
            return channel
        except BaseException as exc:   # never left open: its FIFOs would keep the job's disk busy
            channel.close()
            if not isinstance(exc, Exception):
                raise
            return None

    def _open_channel(self, role: str) -> Channel:
        box = self.container
        if box.released:   # (a warm-up still running as the sandbox closed)
            raise SandboxError("the sandbox is closed")
        with self.exec_gate:
            return Channel.open_exec(box.client.api, box.id, next(self._ids), role=role, workdir=box.config.workdir,
                                     uid=box.uid, gid=box.gid, env=box.env, host_outputs=self._host_outputs(role))

    def _host_outputs(self, role: str) -> bool:
        """Whether the host removes the outputs of the commands a server of this role runs: the agent's, on pid's
        disk (commands.py: OutputFiles)."""
        return role == "agent" and self.container.pid_disk is not None

    def _new_channel(self) -> Channel:
        """An agent server the container's entry started, once it has answered; else a new one (docker exec)."""
        channel = self._take_prestarted()
        if channel is not None:
            return channel
        try:
            return self._open_channel("agent")
        except SandboxError as exc:
            self.raise_if_lost(exc)
            raise

    def raise_if_lost(self, cause: BaseException) -> None:
        """A failure that the container's end explains becomes SandboxLost: the job cannot go on."""
        if self.container.removed_by_pid or not self.container.is_alive():
            raise SandboxLost(f"the sandbox container is gone ({cause})") from cause

    # -- the agent's channels ---------------------------------------------------------------------------------
    def acquire(self) -> Channel:
        """A pooled agent channel, lent until release() or discard(). A dead idle channel was already replaced by
        the pool; a new one that cannot start because the container is gone raises SandboxLost."""
        if self.container.removed_by_pid:
            raise SandboxLost("the sandbox container was removed")
        channel = self._pool.acquire()
        assert channel is not None   # a blocking acquire waits rather than return None
        return channel

    def release(self, channel: Channel) -> None:
        self._pool.release(channel)

    def discard(self, channel: Channel) -> None:
        self._pool.discard(channel)

    def on_spare(self, fn: Callable[[Channel], Any]) -> Any:
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

    # -- the control channel ------------------------------------------------------------------------------------
    def with_control(self, fn: Callable[[Channel], Any]) -> Any:
        """fn(control channel), one caller at a time; a broken control channel is replaced once."""
        if self.container.removed_by_pid:
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
                        self.raise_if_lost(exc)
                        raise
                try:
                    for pgid in list(self._adrift):   # first: a second run beside one could leave a patch of neither
                        channel.kill(pgid, time.monotonic() + CONTROL_TIMEOUT_S)
                        self._adrift.discard(pgid)
                    return fn(channel)
                except ChannelClosed:
                    if attempt:
                        raise
        finally:
            self._control_lock.release()

    def run_as_pid(self, script: str, what: str, timeout: float = 600.0) -> bytes:
        """Run one of pid's own scripts as root on the control channel; its output (at most 16 KiB).

        Raises SandboxError when it fails or outlives `timeout` (the channel is then dropped; what still runs ends
        with the container, which the runner's collection deadline removes).
        """
        return self.with_control(lambda channel: run_script(channel, script, what, timeout, self._adrift))

    def run_as_pid_aside(self, script: str, what: str, timeout: float) -> bytes:
        """run_as_pid on a root channel of its own: a long script (hashing a large tree) while the agent works must
        never hold the control channel, which kills the agent's commands."""
        channel = self._open_channel("control")
        try:
            return run_script(channel, script, what, timeout, self._adrift)
        finally:
            channel.close()

    # -- the end ------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Every channel closed (before the container goes). Never raises."""
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


def run_script(channel: Channel, script: str, what: str, timeout: float, adrift: set[int]) -> bytes:
    """One of pid's scripts on `channel`, to its end within `timeout`; its output (SandboxError when it fails). A run
    that may go on (its server gone, which the OOM killer can choose, its channel broken, or its time up) joins
    `adrift`: ExecChannels kills it before its next control request, which may be this script again. (One whose
    start was never confirmed has no known group: the call fails, saying so.)"""
    pgid, _ = channel.start(script, 16384, time.monotonic() + CONTROL_TIMEOUT_S)
    try:
        done = channel.finish(time.monotonic() + timeout)
    except BaseException:   # (its server gone, the channel broken, an interrupt: the script may run on)
        adrift.add(pgid)
        raise
    if done is None:   # its server waits for it and reads nothing meanwhile: drop the channel
        adrift.add(pgid)
        channel.broken = True
        raise SandboxError(f"{what} did not finish within {timeout:g}s")
    if done.exit_code != 0:
        detail = done.head.decode("utf-8", "replace").strip()[-2000:]
        raise SandboxError(f"{what} failed (exit {done.exit_code}): {detail}")
    return done.head
