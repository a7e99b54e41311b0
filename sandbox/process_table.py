"""The container's process table as pid keeps it in check: room for a command, kills of a command's process group,
and clearing the table when the pids limit refused the agent a fork.

A fork bomb fills the table; pid then kills every process of the agent's uid (never its own servers), from the host
with the container frozen where it can (processes.py), else through the control server's builtins; one that cannot
be seen to have killed them all ends the sandbox.
"""
from __future__ import annotations

import logging
import threading
import time

from pid.sandbox_api import SandboxLost

from .errors import SandboxError
from .exec_channels import CONTROL_TIMEOUT_S, ExecChannels
from .launch import Container
from .processes import ProcessGauge, kill_agent_processes

log = logging.getLogger(__name__)

SWEEP_S = 5.0   # how long the agent's processes may take to be all killed before its container goes instead


class ProcessTable:
    """The process table of one container. Thread-safe."""

    def __init__(self, container: Container, channels: ExecChannels) -> None:
        self.container = container
        self.channels = channels
        self.events = 0      # forks the pids limit refused, as last seen (or dealt with)
        self.clearings = 0   # how often the table was cleared
        self._lock = threading.RLock()
        self._gauge: ProcessGauge | None | bool = None   # the table seen from the host (False: not readable)
        self._gauge_lock = threading.Lock()

    def has_room(self) -> bool:
        """Whether a command may go straight to its waiting shell: the host sees room in the container's process
        table. Otherwise it goes through the server, which refuses it when the table is full (then it is cleared)."""
        gauge = self._gauge
        if gauge is None:
            with self._gauge_lock:
                if self._gauge is None:
                    box = self.container
                    self._gauge = ProcessGauge.open(box.id) or ProcessGauge.open(box.id, box.init_pid()) or False
                gauge = self._gauge
        if not isinstance(gauge, ProcessGauge):
            return False
        try:
            return gauge.has_room()
        except (OSError, ValueError):
            return False

    def kill_group(self, pgid: int) -> bool:
        """SIGKILL a process group inside the container; whether any process was there to signal. The control server
        does it with a builtin: no new process, so a full process table cannot stop it. If even that fails, the
        container goes: nothing may outlive a kill."""
        try:
            return bool(self.channels.with_control(lambda ch: ch.kill(pgid, time.monotonic() + CONTROL_TIMEOUT_S)))
        except SandboxLost:
            raise
        except SandboxError as exc:
            log.info("cannot kill process group %s (%s): removing the container", pgid, exc)   # (the job says why)
            self.container.kill()
            raise SandboxLost(f"could not stop a command inside the sandbox ({exc}); the container was removed") \
                from exc

    def clear(self) -> int:
        """After the pids limit was hit: kill every process of the agent, so that the next call can start; how many.
        From the host with the container frozen where possible (a fork bomb cannot race it, nor starve it of CPU);
        else by pid's server inside, with builtins. The forks refused until then count as dealt with: a later reply
        that shows them must not clear the table again (killing what that command left running). A root agent shares
        pid's uid: nothing tells its processes from pid's, so nothing is killed (0) and no clearing counted."""
        box = self.container
        if box.uid == 0:
            return 0
        sweep = None
        refused: int | None
        if not box.own_kernel:   # (the host sees none of the agent's processes under a kernel of the runtime's)
            with self.channels.exec_gate:   # (no channel starts while it may be frozen: the waits for the dead after)
                sweep = kill_agent_processes(box.client, box.id, box.uid)
        if sweep is None:
            killed, refused, left = self._sweep_inside()
        elif not sweep.thawed:   # nothing can run in it any more: it goes
            box.kill()
            raise SandboxLost("the sandbox container could not be thawed after its process table was cleared; "
                              "it was removed")
        else:
            killed, refused, left = len(sweep.killed), sweep.wait(), int(not sweep.complete)
        if left:   # what pid does next (its patch, a copy, the next command) may not run beside the agent's code
            box.kill()
            raise SandboxLost("the agent's processes outran every attempt to kill them; the container was removed")
        with self._lock:
            self.events = max(self.events, refused or 0)
            self.clearings += 1
        return killed

    def _sweep_inside(self) -> tuple[int, int, int]:
        """The sweep by pid's server, asked again while its last pass still found some of the agent's processes
        (killed ones not dead yet, or a chain that forks as it goes), for SWEEP_S at most; (killed, refused forks,
        left)."""
        deadline = time.monotonic() + SWEEP_S
        killed = 0
        while True:
            more, refused, left = self.channels.with_control(
                lambda ch: ch.kill_agent_processes(time.monotonic() + CONTROL_TIMEOUT_S))
            killed += more
            if not left or time.monotonic() > deadline:
                return killed, refused, left
            time.sleep(0.02)

    def after_command(self, events: int, clearings: int) -> bool:
        """A command's reply saw `events` refused forks, and the table had been cleared `clearings` times before it
        started: whether the limit was hit meanwhile. Forks refused while it ran clear what is left (once, for
        parallel calls)."""
        with self._lock:
            refused = events > self.events
            hit = refused or self.clearings != clearings
            self.events = max(self.events, events)
            if refused:
                self.clear()
        return hit

    def close(self) -> None:
        with self._gauge_lock:
            if isinstance(self._gauge, ProcessGauge):
                self._gauge.close()
            self._gauge = False
