"""The agent's commands and file operations on pooled exec channels (pid.sandbox_api.Sandbox's side of a container).

A command runs in its own process group; on timeout or cancel the group is killed inside the container before the
call returns. Its output goes to a file on pid's own disk, which the host bounds while it runs (output_trim.py) and
removes or keeps while later commands run (outputs.py; OutputFiles.housekeeping).
"""
from __future__ import annotations

import logging
import math
import os
import posixpath
import threading
import time
from typing import Any, Callable, Sequence, TypeVar

from pid.sandbox_api import DEFAULT_OUTPUT, ExecResult, OutputPolicy, SandboxLost

from . import fileops
from .channel import Channel, ChannelClosed, TableFull
from .disk import JobDisk
from .errors import SandboxError
from .exec_channels import CONTROL_TIMEOUT_S, MAX_CHANNELS, ExecChannels
from .launch import Container
from .memory import OUT_OF_MEMORY, MemoryWatch
from .output_trim import FULL_BELOW, count_output, read_tail, trim_front
from .outputs import KeptOutputs
from .process_table import ProcessTable

T = TypeVar("T")
log = logging.getLogger(__name__)

OUTPUT_POLL_S = 0.75       # on_output cadence
OUTPUT_CHUNK = 16384       # at most this much of the newest output per on_output call
CANCEL_POLL_S = 0.1        # how often a waiting call looks at its cancel Event
KILL_GRACE_S = 10.0        # after SIGKILL, the server must report the end within this
FILE_TIMEOUT_S = 120.0     # a read or write of the tools, start to end
READ_LIMIT = 64 << 20      # the most one read_file returns, whatever the caller asks
KEEP_OUTPUT = 64 << 20     # a command's kept output file holds at most about its last this-many bytes...
TRIM_EVERY_S = 1.0         # ...checked this often while it runs
SETTLE_AT = 8              # finished outputs are removed this many at a time, or once TRIM_EVERY_S has passed
HOUSEKEEPING_TIMEOUT_S = 5.0
ALIVE_EVERY_S = 5.0        # how often a long command's wait asks whether its container still runs (see Liveness)
DISK_FULL_BELOW = FULL_BELOW   # the job's disk counts as full, for the model's notice, with less than this left


class Liveness:
    """Whether the container still runs, for a runtime with a kernel of its own: under gVisor a removed container's
    exec streams can stay open, and nothing else would say so before the command's timeout (runc's end at once). The
    engine is asked every ALIVE_EVERY_S from a thread of its own, so that an engine slow to answer (one removing a
    sandbox can be held for minutes) never holds up the wait, its cancel or its deadline."""

    def __init__(self, container: Container, started: float) -> None:
        self.container = container
        self.next = started + ALIVE_EVERY_S
        self.gone = False
        self._asking: threading.Thread | None = None

    def check(self, now: float) -> bool:
        """True once the engine said the container no longer runs."""
        if not self.gone and now >= self.next:
            self.next = now + ALIVE_EVERY_S
            if self._asking is None or not self._asking.is_alive():   # (else the last question is still out)
                self._asking = threading.Thread(target=self._ask, name="pid-sandbox-alive", daemon=True)
                self._asking.start()
        return self.gone

    def _ask(self) -> None:
        if not self.container.is_alive():
            self.gone = True


class OutputFiles:
    """The commands' output files on pid's disk (/.pid/out), opened on the host: which are kept, which go."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.dir_fd: int | None = None
        self.kept = KeptOutputs()   # which finished outputs stay there (under _lock)
        self._lock = threading.Lock()
        self._unsettled: list[tuple[str, bool]] = []   # finished outputs not yet removed or kept: (name, kept)
        self._trimmed: set[str] = set()   # outputs that may have a trimming record (<name>.cut)
        self._next_sweep = 0.0

    def open(self, pid_disk: JobDisk) -> None:
        self.dir_fd = os.open(pid_disk.path("out"), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def finished(self, out_path: str, kept: bool) -> None:
        """A command's reply is read: its output file is to be removed, or kept for the model (outputs.py). That is
        done by a later housekeeping, while a command runs: the host only waits then, and the reply is not held up
        by a removal (~0.1 ms)."""
        with self._lock:
            self._unsettled.append((posixpath.basename(out_path), kept))

    def housekeeping(self) -> None:
        """Settle the finished outputs, and cut back the removed ones that processes left behind still write
        (outputs.py). Both at most once every TRIM_EVERY_S (as often as a running command's sweep comes, so
        back-to-back commands add nothing to what such a process can write between two sweeps), or as SETTLE_AT
        outputs wait: a removal at a command's start costs ~0.1 ms of the host's CPU, a few in a row a fraction of
        that each. Commands seconds apart, as a model's are, settle each at the next one's start."""
        now = self.clock()
        with self._lock:
            if len(self._unsettled) < SETTLE_AT and now < self._next_sweep:
                return
            unsettled, self._unsettled = self._unsettled, []
            if self.dir_fd is None:
                return
            for name, kept in unsettled:
                trimmed = name in self._trimmed
                self._trimmed.discard(name)
                self.kept.finished(self.dir_fd, name, kept, trimmed)
            if now >= self._next_sweep:
                self.kept.sweep(self.dir_fd)
                self._next_sweep = now + TRIM_EVERY_S

    def trim(self, name: str, keep: int, on_full: Callable[[], None] | None = None) -> int | None:
        """Cut a running command's output back to about its last `keep` bytes (output_trim.py): the bytes cut so
        far, None without the directory here. `on_full()`: the disk was full before the cut (output was lost)."""
        if self.dir_fd is None:
            return None
        with self._lock:
            self._trimmed.add(name)
        return self._on_dir(lambda dir_fd: trim_front(dir_fd, name, keep, on_full))

    def clear(self) -> None:
        """Every output goes (the agent's processes are gone): pid's disk is the patch's."""
        with self._lock:
            self._unsettled = []   # (_trimmed stays: a trim under way may still write its record)
            if self.dir_fd is not None:
                self.kept.clear(self.dir_fd)

    def count(self, name: str, tail_bytes: int) -> tuple[int, int, int, bytes] | None:
        """An ended command's output counted on the host (output_trim.count_output); None without the directory
        here, or when it is too long to count at once."""
        return self._on_dir(lambda dir_fd: count_output(dir_fd, name, tail_bytes))

    def tail(self, name: str, offset: int, max_bytes: int) -> tuple[int, bytes] | None:
        """A running command's output since `offset`, read on the host (output_trim.read_tail); None without the
        directory here."""
        return self._on_dir(lambda dir_fd: read_tail(dir_fd, name, offset, max_bytes))

    def _on_dir(self, op: Callable[[int], T]) -> T | None:
        """op(a copy of the directory's descriptor), closed after; None without the directory here."""
        dir_fd = self.dup()
        if dir_fd is None:
            return None
        try:
            return op(dir_fd)
        finally:
            os.close(dir_fd)

    def dup(self) -> int | None:
        """A copy of the directory's descriptor (close() may run meanwhile and its number be reused)."""
        with self._lock:
            return None if self.dir_fd is None else os.dup(self.dir_fd)

    def close(self) -> None:
        with self._lock:
            self.kept.close()
            if self.dir_fd is not None:
                os.close(self.dir_fd)
                self.dir_fd = None


class Commands:
    """Commands, reads and writes of the agent in one container. Thread-safe: concurrent calls use separate
    channels."""

    def __init__(self, container: Container, channels: ExecChannels, processes: ProcessTable) -> None:
        self.container = container
        self.channels = channels
        self.processes = processes
        self.outputs = OutputFiles()
        self.memory = MemoryWatch(container)
        self.agent_started = False   # an agent command (or file op) was started: the workspace may hold its links
        self._flooded: set[str] = set()   # running commands' outputs that found pid's disk full (output_lost)

    def abs(self, path: str) -> str:
        return path if path.startswith("/") else posixpath.join(self.container.config.workdir, path)

    def _start(self, command: bytes | str, emit: int, deadline: float,
               upload: bytes | None) -> tuple[Channel, int, str]:
        """Start a command on a pooled agent channel, which stays lent until its reply is read; (channel, pgid,
        output file). A full process table is cleared first. A channel whose server died while idle is replaced and
        the start retried: a dead server ran nothing."""
        cleared = False
        root = self.container.uid == 0
        for attempt in range(MAX_CHANNELS + 1):
            try:
                channel = self.channels.acquire()
            except SandboxLost:
                raise
            except SandboxError:   # no new channel could start: a full process table is the usual reason
                if cleared or root:
                    raise
                self.processes.clear()
                cleared = True
                continue
            try:
                direct = upload is None and channel.hands_over() and self.processes.has_room()
                pgid, out_path = channel.start(command, emit, deadline, upload=upload, direct=direct)
                return channel, pgid, out_path
            except TableFull:
                self.channels.release(channel)
                if cleared or root:
                    raise
                self.processes.clear()
                cleared = True
            except ChannelClosed as exc:
                self.channels.discard(channel)
                self.channels.raise_if_lost(exc)
                if attempt == MAX_CHANNELS:
                    raise
            except BaseException as exc:
                self.channels.discard(channel)
                if isinstance(exc, SandboxError) and not isinstance(exc, SandboxLost):
                    self.channels.raise_if_lost(exc)
                raise
        raise AssertionError("unreachable")

    def _run(self, command: bytes | str, *, emit: int, timeout: float, cancel: threading.Event | None,
             collect: Callable[[Channel, float], Any], upload: bytes | None = None,
             on_output: Callable[[bytes], None] | None = None) -> tuple[str | None, Any, int, str]:
        """Start a command on an agent channel and wait for its end, its deadline or cancel; (stop reason, reply,
        how often the process table had been cleared before it: a clearing since, to start it or while it ran, may
        have killed its processes, its output file: the caller settles it, see OutputFiles.finished).

        On timeout or cancel its process group is killed inside the container before this returns. The deadline
        counts from before the command (and its upload) is sent; the start itself has its own bound, not the call's:
        a start given up half-way could still run its command later, out of reach, while one that ends past the
        deadline is killed at once below, as timed out. (A command is at most a tool argument's size: see
        pid/tools/registry.py's MAX_ARGUMENT_BYTES.)
        """
        if not self.agent_started:   # (later kills are told once, by the next call to end: one read per call)
            self.memory.mark()
        self.agent_started = True
        started = time.monotonic()
        deadline = started + timeout
        clearings = self.processes.clearings
        try:
            channel, started_pgid, out_path = self._start(command, emit, started + CONTROL_TIMEOUT_S, upload)
        except SandboxError as exc:
            self._explain(exc, self.memory.ran_out())
            raise
        pgid: int | None = started_pgid   # None once the command has ended: nothing left to kill
        try:
            self.outputs.housekeeping()   # (the command runs meanwhile)
            next_poll = started + OUTPUT_POLL_S
            next_trim = started + TRIM_EVERY_S
            liveness = Liveness(self.container, started) if self.container.own_kernel else None
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
                    self.outputs.housekeeping()
                    next_trim = time.monotonic() + TRIM_EVERY_S
                if liveness is not None and liveness.check(now):
                    raise SandboxLost("the sandbox container is gone (the engine no longer runs it)")
                wake = min(deadline, next_trim, liveness.next if liveness is not None else deadline)
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
                self.processes.kill_group(started_pgid)
                reply = collect(channel, time.monotonic() + KILL_GRACE_S)
                if reply is None:
                    reply = self._end_unkilled(channel, started_pgid, collect)
            pgid = None
        except BaseException as exc:
            # (looked at first: the kill below may remove the container, and its cgroup with the count)
            out_of_memory = isinstance(exc, SandboxError) and self.memory.ran_out()
            if pgid is not None and not isinstance(exc, SandboxLost):   # interrupted while it runs: it must
                # not outlive us (a container that is gone has nothing left to kill, nor a channel that answers)
                try:
                    self.processes.kill_group(pgid)
                except Exception:
                    pass
            self.channels.discard(channel)
            if isinstance(exc, SandboxError):
                self._explain(exc, out_of_memory)
            raise
        self.channels.release(channel)
        return stop, reply, clearings, out_path

    def _explain(self, exc: SandboxError, out_of_memory: bool) -> None:
        """Raise what a failed call means: SandboxLost when its container is gone, and either way the cause when the
        kernel killed processes for memory meanwhile (pid's server may have been one). Returns when there is no more
        to say."""
        lost = exc if isinstance(exc, SandboxLost) else None
        if lost is None:
            try:
                self.channels.raise_if_lost(exc)
            except SandboxLost as gone:
                lost = gone
        if lost is not None:
            if out_of_memory or self.container.oom_killed():   # (a container that ended: its count went with it)
                raise SandboxLost(f"the sandbox container is gone: {OUT_OF_MEMORY}") from exc
            raise lost
        if out_of_memory:
            raise SandboxError(f"pid's server for this call was lost: {OUT_OF_MEMORY}") from exc

    def _end_unkilled(self, channel: Channel, pgid: int, collect: Callable[[Channel, float], Any]) -> Any:
        """A command still unreported KILL_GRACE_S after the SIGKILL of its group. Its group is killed again: if
        nothing was left in it, the report may only be late (a loaded machine), which gets as long again. Then (or at
        once, if processes were left: a fork bomb's shells can outpace one kill, gVisor's kernel signals a large
        group slowly, and bash sleeps between the forks it is refused) every process of the agent is killed: one may
        hold what the report waits for (a tracer of the helper the server runs as the agent). If the reply still does
        not come, the container goes: nothing may outlive a kill, and a job must not wait on a sandbox that cannot
        end a command."""
        log.warning("command (process group %s) unreported %.0f s after SIGKILL", pgid, KILL_GRACE_S)
        try:
            reply = None
            if not self.processes.kill_group(pgid):
                reply = collect(channel, time.monotonic() + KILL_GRACE_S)
            if reply is None:
                self.processes.clear()
                reply = collect(channel, time.monotonic() + KILL_GRACE_S)
        except SandboxLost:
            raise
        except SandboxError as exc:
            self.channels.raise_if_lost(exc)
            reply, cause = None, f" ({exc})"
        else:
            cause = ""
        if reply is None:
            self.container.kill()
            raise SandboxLost(f"a command did not end after SIGKILL of its process group {pgid} and of every process "
                              f"of the agent{cause}; the container was removed")
        return reply

    def exec(self, command: str, *, timeout: float, output: OutputPolicy = DEFAULT_OUTPUT,
             on_output: Callable[[bytes], None] | None = None,
             cancel: threading.Event | None = None) -> ExecResult:
        stop, reply, clearings, out_path = self._run(
            command, emit=output.tail_bytes + 1, timeout=timeout, cancel=cancel, on_output=on_output,
            collect=lambda ch, deadline: ch.wait_exec(deadline, output, count_here=self._count_output))
        lost = out_path in self._flooded
        self._flooded.discard(out_path)
        self.outputs.finished(out_path, kept=reply.kept_path is not None)
        pids_hit = self.processes.after_command(reply.pids_events, clearings)
        return ExecResult(
            exit_code=None if stop else reply.exit_code, tail=reply.tail, total_bytes=reply.total_bytes,
            total_lines=reply.total_lines, timed_out=stop == "timed_out", cancelled=stop == "cancelled",
            output_path=reply.kept_path, output_from=reply.kept_from, pids_limit_hit=pids_hit,
            disk_full=self._disk_full(), out_of_memory=self.memory.ran_out(), output_lost=lost)

    def _disk_full(self) -> bool:
        """The job's disk has no room left for the agent's writes (blocks or inodes): a command that hides its errors
        (or a file tool's plain ENOSPC) says no more, so the model is told. One statvfs on the host."""
        st = self._disk_stats()
        return st is not None and (self._free(st) < DISK_FULL_BELOW or st.f_favail == 0)

    def _disk_free(self) -> float:
        """Bytes the agent may still write on the job's disk (infinite without one, or where it cannot be read)."""
        st = self._disk_stats()
        return math.inf if st is None else self._free(st)

    def _disk_stats(self) -> os.statvfs_result | None:
        try:
            return None if self.container.disk is None else os.statvfs(self.container.disk.mountpoint)
        except OSError:
            return None

    def _free(self, st: os.statvfs_result) -> int:
        return (st.f_bfree if self.container.uid == 0 else st.f_bavail) * st.f_frsize   # (root: ext4's reserve too)

    def _file_op(self, snippet: bytes, path: str, *, emit: int, timeout: float, cancel: threading.Event | None,
                 upload: bytes | None = None) -> bytes:
        stop, done, _, out_path = self._run(snippet, emit=emit, timeout=timeout, cancel=cancel, upload=upload,
                                            collect=lambda ch, deadline: ch.finish(deadline))
        self._flooded.discard(out_path)   # (a file tool's output is pid's own snippet's: nothing to tell)
        self.outputs.finished(out_path, kept=False)
        if stop == "cancelled":
            raise InterruptedError(f"cancelled: {path}")
        if stop == "timed_out":
            raise TimeoutError(f"no answer within {timeout:g}s: {path}")
        fileops.raise_for_status(done.exit_code, path)
        return done.head

    def read_file(self, path: str, *, max_bytes: int | None = None, timeout: float = FILE_TIMEOUT_S,
                  cancel: threading.Event | None = None) -> bytes:
        limit = READ_LIMIT if max_bytes is None else max(0, min(max_bytes, READ_LIMIT))
        target = self.abs(path)
        return self._file_op(fileops.read_snippet(self.channels.shell, target, limit), target, emit=limit,
                             timeout=timeout, cancel=cancel)

    def readable_files(self, paths: Sequence[str], *, timeout: float = FILE_TIMEOUT_S) -> set[str]:
        targets = [self.abs(p) for p in paths]
        if not targets:
            return set()
        # (the first 4 KiB of its output: the indexes, after whatever the image's BASH_ENV may print)
        found = self._file_op(fileops.readable_snippet(targets), ", ".join(targets), emit=4096, timeout=timeout,
                              cancel=None)
        return {paths[i] for i in fileops.readable_indexes(found, len(targets))}

    def write_file(self, path: str, data: bytes, *, timeout: float = FILE_TIMEOUT_S,
                   cancel: threading.Event | None = None) -> None:
        target = self.abs(path)
        data = bytes(data)
        shell = self.channels.shell
        careful = self._disk_free() < len(data) + fileops.ROOM_MARGIN   # (a failed write must not empty the file)
        inline = fileops.inline_write_snippet(target, data, fileops.INLINE_MAX, careful) if shell == "bash" else None
        if inline is not None:   # a short command: the host can hand it to the slot shell itself (Channel.start)
            self._file_op(inline, target, emit=0, timeout=timeout, cancel=cancel)
            return
        self._file_op(fileops.write_snippet(shell, target, len(data), careful), target, emit=0, timeout=timeout,
                      cancel=cancel, upload=data)

    # -- housekeeping while a command runs ------------------------------------------------------------------------
    def _trim_output(self, out_path: str, cut: int) -> int:
        """Keep a long-running command's output from filling the job's disk: beyond KEEP_OUTPUT only its tail is
        kept. Returns the bytes cut so far. With a job disk the host cuts it (output_trim); without one, a spare
        channel does. A disk found full before the cut marks the output as flooded (output_lost)."""
        try:
            done = self.outputs.trim(posixpath.basename(out_path), KEEP_OUTPUT, lambda: self._flooded.add(out_path))
        except OSError as exc:
            log.info("cannot trim %s: %s", out_path, exc)
            return cut
        if done is not None:
            return done
        done = self.channels.on_spare(
            lambda ch: ch.trim(out_path, KEEP_OUTPUT, time.monotonic() + HOUSEKEEPING_TIMEOUT_S))
        return cut if done is None else done

    def _count_output(self, out_path: str, tail_bytes: int) -> tuple[int, int, int, bytes] | None:
        """An ended command's long output, counted: (newlines, bytes, bytes cut, its last tail_bytes bytes), or None
        for the server to count it. First all but its tail is cut from the host, which counts the newlines that go
        without reading holes: a command can make its output terabytes of holes in a moment (`truncate -s 2T
        /dev/stdout`), which the server's `wc` read for hours past the call's timeout. Then, where the container's
        writes are the host kernel's (runc), the host counts the rest too: the server's count forks, which a full
        process table (a fork bomb left running) held up past every deadline. (Without a job disk the server counts
        all of it: a spare channel's trim would read the holes as well.) A disk found full as this trim begins marks
        the output as flooded (output_lost)."""
        name = posixpath.basename(out_path)
        try:
            self.outputs.trim(name, KEEP_OUTPUT, lambda: self._flooded.add(out_path))
            return self.outputs.count(name, tail_bytes) if self.container.host_kernel else None
        except OSError as exc:
            log.info("cannot trim or count %s: %s", out_path, exc)
            return None

    def _poll_output(self, out_path: str, offset: int, on_output: Callable[[bytes], None]) -> int:
        """Hand output appended since `offset` to on_output: read on the host where the container's writes are its
        kernel's (runc, with pid's disk here), else through a spare channel if one is free."""
        got = None
        if self.container.host_kernel:
            try:
                got = self.outputs.tail(posixpath.basename(out_path), offset, OUTPUT_CHUNK)
            except OSError as exc:
                log.info("cannot read %s: %s", out_path, exc)
                return offset
        if got is None:
            got = self.channels.on_spare(
                lambda ch: ch.tail(out_path, offset, OUTPUT_CHUNK, time.monotonic() + HOUSEKEEPING_TIMEOUT_S))
        if got is None:
            return offset
        size, chunk = got
        if chunk:
            on_output(chunk)
        return max(offset, size)
