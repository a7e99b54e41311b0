"""One exec channel: a long-lived `channel.sh` server inside the container, spoken to over its stdin and stdout.

Why: `docker exec` per tool call costs ~60 ms; a request on a warm channel costs about a millisecond.
A channel serves one request at a time (the pool hands it to one caller); the protocol is described once, at the
top of channel.sh. Every reply has one shape, "<TAG> <nonce> <fields...> <length>\n" and <length> bytes, and one
reader (`read_reply`) takes it apart. The server is pid's (root), but the host trusts nothing it reads: every read
has a deadline and a byte limit, a reply must carry the nonce of the request that asked and the tag and fields that
request allows, and any desync, overflow or broken stream raises SandboxError; the caller discards the channel.

Two links carry the bytes. A `docker exec` with an attached stream (StreamLink) works with any engine. With a job
disk, whose /.pid/run is a host directory, the servers a sandbox needs first are started by the container's own entry
command with two FIFOs of that directory as stdin and stdout (PipeLink): no `docker exec` (~0.1 s each) before the
first request, and the bytes go through the kernel only.
"""
from __future__ import annotations

import functools
import io
import importlib.resources
import os
import re
import secrets
import select
import socket
import stat
import tarfile
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from pid.sandbox_api import OutputPolicy

from . import drop_helper
from .errors import SandboxError
from .frames import BoundedReader, FrameReader, PipeReader, ReplyTooLarge, StreamClosed, wait_ready

SCRIPT = importlib.resources.files(__package__).joinpath("channel.sh").read_bytes()
# What channel.sh sources from beside itself: the greeting, pid's requests on outputs and processes, and what sh
# uses without bash.
PARTS = {name: importlib.resources.files(__package__).joinpath(name).read_bytes()
         for name in ("channel_hello.sh", "channel_ops.sh", "channel_sh.sh")}
PID_DIR = "/.pid"
SCRIPT_PATH = f"{PID_DIR}/channel.sh"

# Prefer bash (faster paths), fall back to POSIX sh. stderr goes nowhere: nothing may reach the stream before
# the host's first request, and the protocol reports errors in-band.
# The image's PATH is kept for the agent's commands; pid's own server is looked up only in root-owned system
# directories (an image PATH may name a directory the agent can write).
_BOOT = ('exec 2>/dev/null; PID_IMAGE_PATH=$PATH; export PID_IMAGE_PATH; PATH=/usr/sbin:/usr/bin:/sbin:/bin; '
         'export PATH; if command -v bash >/dev/null 2>&1; then exec bash "$@"; fi; exec sh "$@"')

# The container's entry command when its first servers start with it: each reads its requests from
# /.pid/run/req.<id> and writes its replies to /.pid/run/rep.<id>, FIFOs the host made and opened before the start;
# then the entry becomes the time-to-live `sleep`, as without them. Nothing here is the agent's: the FIFOs' directory
# is root's (0700) and the servers run as root. Arguments: ttl, workdir, uid, gid, _BOOT, then "<role>:<id>"...
_ENTRY = ('exec </dev/null >/dev/null 2>/dev/null; t=$1 w=$2 u=$3 g=$4 b=$5; shift 5; for s in "$@"; do '
          '( exec <"/.pid/run/req.${s#*:}" >"/.pid/run/rep.${s#*:}" && '
          'exec /bin/sh -c "$b" pid-boot ' + SCRIPT_PATH + ' "${s%%:*}" "${s#*:}" "$w" "$u" "$g" ) & done; '
          'exec sleep "$t"')
RUN_DIR = "run"   # the FIFOs' directory in /.pid

STARTUP_TIMEOUT = 30.0
REPLY_TIMEOUT = 30.0     # for requests that must answer promptly (start, kill, counts)
LINE_LIMIT = 1024        # no reply header is longer
REQUEST_HEADER = 128     # every request's first line, padded with spaces to this size: bash reads it in one system
                         # call (a line it reads byte by byte, one call each: it may not read past the newline)
HELLO_LIMIT = 4096       # a setup failure's reason
DIRECT_MAX = 4000       # a command the host writes into a slot's FIFO itself: one atomic write (PIPE_BUF is 4096)

# The only paths a request names are output files the server itself reported: checked once, sent as they are.
OUTPUT_FILE = re.compile(r"/\.pid/out/[0-9]{1,10}\.[0-9]{1,12}")   # (so that a request naming one fits its line)
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)   # (Linux, the BSDs, macOS)


def install_script(api, container_id: str, host_dir: str | None) -> None:
    """Put channel.sh and its parts, and pid's privilege drop and its zygote where there are (drop_helper.py), into
    /.pid, root-owned: the agent may read them, never change them. With a job disk, /.pid is a fresh directory of it
    on the host, written before the container starts (no engine request); otherwise they go in as a tar stream
    through the API (no exec)."""
    drop, zygote = drop_helper.program(), drop_helper.library()
    files = {"channel.sh": (SCRIPT, 0o555), **{name: (data, 0o444) for name, data in PARTS.items()},
             drop_helper.DROP.name: (drop or b"", 0o555 if drop else 0o444),
             drop_helper.ZYGOTE.name: (zygote or b"", 0o444)}
    if host_dir is not None:   # (a fresh directory: without a drop of pid's there is none, and setpriv is used)
        for name, (data, mode) in files.items():
            if not data:
                continue
            fd = os.open(os.path.join(host_dir, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        return
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folder = tarfile.TarInfo(PID_DIR.lstrip("/"))
        folder.type, folder.mode = tarfile.DIRTYPE, 0o711
        tar.addfile(folder)
        for name, (data, mode) in files.items():   # (an empty, unexecutable drop replaces any the image has)
            member = tarfile.TarInfo(f"{folder.name}/{name}")
            member.size, member.mode = len(data), mode
            tar.addfile(member, io.BytesIO(data))
    try:
        api.put_archive(container_id, "/", buffer.getvalue())
    except Exception as exc:
        raise SandboxError(f"cannot install the exec channel script: {exc}") from exc


def entry_command(ttl: int, servers: list[tuple[str, int]], workdir: str, uid: int, gid: int) -> list[str]:
    """The container's command: start `servers` ((role, channel id), their FIFOs made as PipeLinks), then sleep
    `ttl` seconds as the main process (the container ends, and is removed, when it does)."""
    return ["/bin/sh", "-c", _ENTRY, "pid-entry", str(ttl), workdir, str(uid), str(gid), _BOOT,
            *(f"{role}:{channel_id}" for role, channel_id in servers)]


class StreamLink:
    """The server started by `docker exec`, its stdin and stdout the exec's attached stream (through the engine)."""

    def __init__(self, api, container_id: str, argv: list[str], env: Mapping[str, str]) -> None:
        try:
            exec_id = api.exec_create(container_id, argv, stdin=True, stdout=True, stderr=True, tty=False,
                                      environment=dict(env), workdir="/", user="0:0")["Id"]
            self._response = api.exec_start(exec_id, socket=True)
        except Exception as exc:  # docker.errors.* and transport errors alike
            raise SandboxError(f"cannot start exec channel: {exc}") from exc
        self.sock: socket.socket = getattr(self._response, "_sock", self._response)
        self.sock.settimeout(None)
        self.reader: BoundedReader = FrameReader(self.sock)

    def send(self, data: bytes, deadline: float) -> None:
        """All of `data` by `deadline` (TimeoutError otherwise): a stopped server stops reading, and sendall would
        block forever."""
        if _DONTWAIT and type(self.sock) is socket.socket:
            # A request fits the socket's buffer: one send that cannot block, and no switching the socket to
            # timeout mode and back (two more system calls). What does not fit goes on the way below.
            try:
                sent = self.sock.send(data, _DONTWAIT)
            except BlockingIOError:
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        try:
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            self.sock.sendall(data)
        finally:
            try:
                self.sock.settimeout(None)
            except OSError:
                pass

    def close(self) -> None:
        """EOF on the server's stdin, and the stream dropped. Never raises."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for obj in (self.sock, self._response):
            try:
                obj.close()
            except Exception:
                pass


class PipeLink:
    """A server's stdin and stdout as two FIFOs in pid's disk's /.pid/run, made and opened by the host before the
    server (started by the container's entry) opens them. The host holds the request FIFO read-write, so that opening
    it never blocks on either side; the server's end shows as EOF on the reply FIFO. Once the server has answered,
    the FIFOs' names go: nothing else can ever open them."""

    def __init__(self, run_dir_fd: int, channel_id: int) -> None:
        self._dir_fd = os.dup(run_dir_fd)
        self._channel_id = channel_id
        self._names = [f"req.{channel_id}", f"rep.{channel_id}"]
        self.req_fd = self.rep_fd = -1
        self.slot_fds: list[int] = []   # the server's two slot FIFOs (see Channel.start)
        self._reader: PipeReader | None = None
        try:
            for name in self._names:
                os.mkfifo(name, 0o600, dir_fd=self._dir_fd)
            # The reply end first, read-only: a FIFO with no writer yet reads as "nothing there", not as EOF.
            self.rep_fd = self._open(self._names[1], os.O_RDONLY)
            self.req_fd = self._open(self._names[0], os.O_RDWR)
        except OSError as exc:
            self.close()
            raise SandboxError(f"cannot make the exec channel's pipes: {exc}") from exc
        self._reader = PipeReader(self.rep_fd)
        self.reader: BoundedReader = self._reader

    def _open(self, name: str, mode: int) -> int:
        fd = os.open(name, mode | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._dir_fd)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(f"{name} is not a FIFO")
        return fd

    def send(self, data: bytes, deadline: float) -> None:
        """All of `data` by `deadline` (TimeoutError otherwise)."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.req_fd, view):]
            except BlockingIOError:
                pass
            if view:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the request FIFO is full")
                wait_ready(self.req_fd, select.POLLOUT, left)

    def connected(self, slots: bool) -> None:
        """The server has answered: unlink the FIFOs' names (nothing else can open them now), and hold the request
        FIFO write-only from here on, so that writing to a dead server fails at once (EPIPE) instead of filling the
        pipe. With `slots` (a bash agent server), the command FIFOs of its two slot shells, made by the server when
        it answered, are opened first (and their names go too). Never raises."""
        if slots:
            self._open_slots()
        try:
            for name in self._names:
                try:
                    os.unlink(name, dir_fd=self._dir_fd)
                except OSError:
                    pass
            os.close(self._dir_fd)
        except OSError:
            pass
        self._dir_fd = -1
        try:
            writer = os.open(f"/proc/self/fd/{self.req_fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:   # (no /proc: keep the read-write end)
            return
        os.close(self.req_fd)
        self.req_fd = writer

    def _open_slots(self) -> None:
        """slot_fds <- cmd.<id>.0 and cmd.<id>.1, non-blocking, read-write (the host reads only in take_back);
        left empty if either cannot be opened."""
        fds: list[int] = []
        try:
            for slot in (0, 1):
                name = f"cmd.{self._channel_id}.{slot}"
                fds.append(self._open(name, os.O_RDWR))
                self._names.append(name)
        except OSError:
            for fd in fds:
                os.close(fd)
            return
        self.slot_fds = fds

    def write_slot(self, slot: int, data: bytes) -> bool:
        """All of `data` (at most PIPE_BUF bytes: one atomic write) into a slot's FIFO now, or nothing (False)."""
        try:
            return os.write(self.slot_fds[slot], data) == len(data)
        except OSError:   # (full: BlockingIOError)
            return False

    def take_back(self, slot: int, size: int) -> bool:
        """The server died after `size` bytes were written into a slot's FIFO: read back what its shell did not take.
        True when something was left, so the shell cannot have the whole command: nothing of it runs."""
        try:
            return bool(os.read(self.slot_fds[slot], size))
        except OSError:   # (BlockingIOError: the shell took it all)
            return False

    def close(self) -> None:
        """EOF on the server's stdin. Never raises; the names stay (pid's disk goes with the job)."""
        for fd in self.slot_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.slot_fds = []
        if self._reader is not None:
            self._reader.forget()
        for attr in ("req_fd", "rep_fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                setattr(self, attr, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass
        if self._dir_fd >= 0:
            try:
                os.close(self._dir_fd)
            except OSError:
                pass
            self._dir_fd = -1


@dataclass
class Reply:
    """One reply of the server's: its tag, its fields (checked as the request allows), its payload."""
    tag: bytes
    fields: list[bytes]
    payload: bytes

    def number(self, index: int) -> int:
        return int(self.fields[index])


# What a field may be: "d" a decimal number, "p" an output file of the server's, "w" the server's shell.
_FIELD_PATTERNS = {"d": rb"[0-9]{1,20}", "p": OUTPUT_FILE.pattern.encode(), "w": rb"bash|sh"}


@functools.lru_cache(maxsize=None)
def _fields_shape(kinds: str) -> re.Pattern[bytes]:
    """The fields of a reply with `kinds`, then its payload's length: one pattern, matched once per reply."""
    return re.compile(b"".join(b"(?:%s) " % _FIELD_PATTERNS[kind] for kind in kinds) + _FIELD_PATTERNS["d"])


def read_reply(reader: BoundedReader, nonce: bytes, expect: Mapping[bytes, str], limit: int,
               deadline: float) -> Reply | None:
    """The next reply, which must answer the request that sent `nonce`, with a tag of `expect`, whose kinds of fields
    it has (see _FIELD_PATTERNS), and a payload of at most `limit` bytes; None when no header came by `deadline` (the
    payload, once announced, gets REPLY_TIMEOUT more, or SandboxError). Anything else (another nonce or tag, a refusal
    "E", a malformed or oversized reply) raises ProtocolError: the server is confused or hostile, and the channel is
    dropped. The payload is counted, never searched for an end mark: no byte of it can end the reply early or pass for
    the next one."""
    try:
        header = reader.read_until(b"\n", deadline, LINE_LIMIT)
    except ReplyTooLarge as exc:
        raise ProtocolError(f"exec channel: a reply header of over {LINE_LIMIT} bytes") from exc
    if header is None:
        return None
    tag, _, rest = header.partition(b" ")
    given, _, rest = rest.partition(b" ")
    kinds = expect.get(tag)
    if kinds is None or given != nonce:
        raise ProtocolError(f"exec channel: unexpected reply {header[:80]!r}")
    if _fields_shape(kinds).fullmatch(rest) is None:
        raise ProtocolError(f"exec channel: malformed reply {header[:80]!r}")
    words = rest.split(b" ")
    fields, length = words[:-1], words[-1]
    if int(length) > limit:
        raise ProtocolError(f"exec channel sent more than was asked for ({int(length)} > {limit} bytes)")
    payload = reader.read_exact(int(length), max(deadline, time.monotonic() + REPLY_TIMEOUT))
    if payload is None:
        raise SandboxError("exec channel did not send a whole reply in time")
    return Reply(tag, fields, payload)


def request_line(header: bytes) -> bytes:
    """A request's first line, REQUEST_HEADER bytes with its newline (the fields are pid's: numbers, a nonce, an
    output file's name)."""
    if len(header) >= REQUEST_HEADER or b"\n" in header:
        raise ValueError(f"a request header of over {REQUEST_HEADER - 1} bytes, or of two lines: {header[:80]!r}")
    return header.ljust(REQUEST_HEADER - 1) + b"\n"


def new_nonce() -> bytes:
    return secrets.token_hex(12).encode()


class SetupFailed(SandboxError):
    """The server started and said why the sandbox cannot work (no setpriv in the image, an unusable workdir...)."""


class ChannelClosed(SandboxError):
    """The channel's server is gone (killed, or the container stopped)."""


class TableFull(SandboxError):
    """The container's process table is full: the command was not started (the channel is fine)."""


class ProtocolError(SandboxError):
    """The server answered something no request asked for (too much, or malformed): the channel is dropped."""


@dataclass
class Finished:
    """A command's end as the server reports it."""
    head: bytes          # the first `emit` bytes of its output
    exit_code: int
    pids_events: int     # forks refused by the pids limit since the container started


@dataclass
class ExecReply:
    exit_code: int
    total_lines: int
    total_bytes: int
    tail: bytes               # the last tail_bytes bytes of the output
    kept_path: str | None     # the output file, kept when the output is longer than the tail
    pids_events: int
    kept_from: int = 0        # bytes cut from the front of the kept file (its disk use was capped)


class Channel:
    """A server on a link: `open_exec` starts one with `docker exec`; a server the container's entry started is
    greeted with `send_hello` and `await_hello`."""

    def __init__(self, link: StreamLink | PipeLink, channel_id: int, role: str) -> None:
        self.link = link
        self.reader = link.reader
        self.channel_id = channel_id
        self.role = role
        self.broken = False
        self.shell = "sh"
        self.pids_events = 0
        self._slot = 0   # the slot shell the server runs the next command on

    @classmethod
    def open_exec(cls, api, container_id: str, channel_id: int, *, role: str, workdir: str, uid: int, gid: int,
                  env: Mapping[str, str], host_outputs: bool = False) -> "Channel":
        link = StreamLink(api, container_id, ["/bin/sh", "-c", _BOOT, "pid-boot", SCRIPT_PATH, role, str(channel_id),
                                              workdir, str(uid), str(gid)], env)
        channel = cls(link, channel_id, role)
        try:
            channel.send_hello(time.monotonic() + STARTUP_TIMEOUT, host_outputs)
            channel.await_hello(time.monotonic() + STARTUP_TIMEOUT)
        except BaseException:
            channel.close()
            raise
        return channel

    def send_hello(self, deadline: float, host_outputs: bool = False) -> None:
        """`host_outputs`: the host removes the outputs of the commands it runs on this server (commands.py's
        OutputFiles), which then leaves them alone: removed first, one could not be held and cut back."""
        self._hello_nonce = new_nonce()
        self._send(request_line(b"h %s%s" % (self._hello_nonce, b" o" if host_outputs else b"")), deadline)

    def await_hello(self, deadline: float, alive: Callable[[], bool] | None = None) -> None:
        """The server's answer to "h". `alive` (is the container up?) is asked every second while none comes: a
        server that never started leaves its reply FIFO silent, not closed."""
        while True:
            step = deadline if alive is None else min(deadline, time.monotonic() + 1.0)
            try:
                hello = self._reply(self._hello_nonce, {b"R": "wd", b"F": ""}, HELLO_LIMIT, step)
            except ProtocolError as exc:
                raise SandboxError(f"exec channel did not start ({exc}); does the image have /bin/sh?") from exc
            if hello is not None:
                break
            if time.monotonic() >= deadline:
                self.broken = True
                raise SandboxError("exec channel did not answer in time")
            if alive is not None and not alive():
                self.broken = True
                raise ChannelClosed("exec channel closed (container stopped?)")
        if hello.tag == b"F":
            self.broken = True
            raise SetupFailed(f"sandbox setup failed: {hello.payload.decode('utf-8', 'replace')}")
        self.shell = hello.fields[0].decode()
        self.pids_events = hello.number(1)
        if isinstance(self.link, PipeLink):
            self.link.connected(slots=self.role == "agent" and self.shell == "bash")

    # -- transport -------------------------------------------------------------------------------------
    def _send(self, data: bytes, deadline: float) -> None:
        try:
            self.link.send(data, deadline)
        except TimeoutError as exc:   # (socket.timeout too)
            self.broken = True
            raise SandboxError("exec channel did not take the request in time") from exc
        except OSError as exc:
            self.broken = True
            raise ChannelClosed(f"exec channel broken: {exc}") from exc

    def _reply(self, nonce: bytes, expect: Mapping[bytes, str], limit: int, deadline: float) -> Reply | None:
        """read_reply on this channel: a failure of any kind marks it broken."""
        try:
            return read_reply(self.reader, nonce, expect, limit, deadline)
        except StreamClosed as exc:
            self.broken = True
            detail = self.reader.err_tail.decode("utf-8", "replace").strip()[-300:]
            raise ChannelClosed("exec channel closed (container stopped?)" + (f": {detail}" if detail else "")) from exc
        except SandboxError:
            self.broken = True
            raise
        except OSError as exc:
            self.broken = True
            raise SandboxError(f"exec channel broken: {exc}") from exc

    def _request(self, request: bytes, nonce: bytes, expect: Mapping[bytes, str], limit: int,
                 deadline: float) -> Reply:
        """Send a request and read its reply, which must come by `deadline`."""
        self._send(request, deadline)
        reply = self._reply(nonce, expect, limit, deadline)
        if reply is None:
            self.broken = True
            raise SandboxError("exec channel did not answer in time")
        return reply

    def is_idle_clean(self) -> bool:
        """An idle channel has nothing to read; anything there (or EOF) means its server is gone or confused."""
        try:
            return not self.reader.has_pending()
        except OSError:
            return False

    # -- commands ----------------------------------------------------------------------------------------
    def hands_over(self) -> bool:
        """Whether a short command can be written straight into the FIFO of the shell that will run it."""
        return isinstance(self.link, PipeLink) and bool(self.link.slot_fds)

    def start(self, command: bytes | str, emit: int, deadline: float,
              upload: bytes | None = None, direct: bool = False) -> tuple[int, str]:
        """Start a command (with `upload` stored in a file passed to it as "$1"); returns (pgid, output file).
        `direct`: a short command may be written straight into its waiting shell's FIFO (the caller saw room in the
        process table: nothing refuses it then).

        Collect its end with `finish`, which returns at most `emit` bytes of its output.
        """
        cmd = command.encode("utf-8", "surrogateescape") if isinstance(command, str) else command
        if b"\0" in cmd:
            raise ValueError("a command cannot contain NUL bytes")
        self._nonce = new_nonce()
        self._emit = max(0, emit) if upload is None else 0
        link = self.link
        handed = b""
        slot = b"-"
        if direct and upload is None and 0 < len(cmd) <= DIRECT_MAX and isinstance(link, PipeLink) and link.slot_fds:
            handed = b"%d\n%s" % (len(cmd), cmd)
            direct = link.write_slot(self._slot, handed)
            slot = b"%d" % self._slot if direct else b"-"   # the slot's shell is running it already
        else:
            direct = False
        data = b"-" if upload is None else b"%d" % len(upload)
        sent = False
        try:
            self._send(request_line(b"r %s %d %s %d %s" % (self._nonce, self._emit, slot, len(cmd), data)) + cmd +
                       (upload or b""), deadline)
            sent = True
            started = self._reply(self._nonce, {b"P": "dp", b"B": ""}, 0, deadline)
            if started is None:
                self.broken = True
                raise SandboxError("exec channel did not answer in time")
        except ChannelClosed as exc:
            # A server that could not take the request ran nothing, and the caller may try another channel. One that
            # took it and went away may have handed the command to a shell, which outlives it; a command handed to
            # its shell by the host may have run, unless it can be taken back from the FIFO.
            if direct:
                unsure = not (isinstance(link, PipeLink) and link.take_back(self._slot, len(handed)))
            else:
                unsure = sent
            if unsure:
                raise SandboxError(f"exec channel broke as a command started: {exc}") from exc
            raise
        if started.tag == b"B":
            raise TableFull("the container's process table is full")
        self._out_path = started.fields[1].decode()
        self._slot = 1 - self._slot   # as the server's slot alternates (the next shell is up)
        return started.number(0), self._out_path

    def finish(self, deadline: float) -> Finished | None:
        """The started command's end, or None if `deadline` passes first (the command keeps running)."""
        done = self._reply(self._nonce, {b"D": "dd"}, self._emit, deadline)
        if done is None:
            return None
        self.pids_events = done.number(1)
        return Finished(done.payload, done.number(0), self.pids_events)

    def wait_exec(self, deadline: float, output: OutputPolicy,
                  count_here: Callable[[str, int], tuple[int, int, int, bytes] | None] | None = None
                  ) -> ExecReply | None:
        """`finish` for a command started with emit = tail_bytes + 1, with its totals and its kept output file. A long
        output is counted by `count_here(file, tail_bytes)` when it can (None: by the server, see count)."""
        done = self.finish(deadline)
        if done is None:
            return None
        head = done.head
        tail_bytes = output.tail_bytes
        newlines = head.count(b"\n")
        cut = 0
        # (A head over tail_bytes is not the whole output: the policy keeps that, whatever its lines say.)
        if not output.keeps(len(head), newlines + (1 if head and not head.endswith(b"\n") else 0)):
            tail, total, kept = head, len(head), None
        else:
            counted = count_here(self._out_path, max(1, tail_bytes)) if count_here is not None else None
            newlines, total, cut, tail = counted or self.count(self._out_path, max(1, tail_bytes),
                                                               time.monotonic() + REPLY_TIMEOUT)
            kept = self._out_path
        lines = newlines + (1 if tail and not tail.endswith(b"\n") else 0)
        tail = tail[max(0, len(tail) - tail_bytes):] if tail_bytes else b""
        return ExecReply(done.exit_code, lines, total, tail, kept, done.pids_events, cut)

    def count(self, path: str, tail_bytes: int, deadline: float) -> tuple[int, int, int, bytes]:
        """(newlines, bytes, bytes cut from its front, last tail_bytes bytes) of an output file, which is kept (not
        removed with the junk)."""
        nonce = new_nonce()
        reply = self._request(request_line(b"c %s %d %s" % (nonce, tail_bytes, path.encode())), nonce,
                              {b"C": "ddd"}, tail_bytes, deadline)
        return reply.number(0), reply.number(1), reply.number(2), reply.payload

    def trim(self, path: str, keep: int, deadline: float) -> int:
        """Bound a running command's output file to about its last `keep` bytes on disk; bytes cut so far."""
        nonce = new_nonce()
        return self._request(request_line(b"T %s %d %s" % (nonce, keep, path.encode())), nonce, {b"T": "d"}, 0,
                             deadline).number(0)

    def tail(self, path: str, offset: int, max_bytes: int, deadline: float) -> tuple[int, bytes]:
        """(current size, bytes appended since `offset`, at most the last `max_bytes` of them)."""
        nonce = new_nonce()
        reply = self._request(request_line(b"t %s %d %d %s" % (nonce, offset, max_bytes, path.encode())), nonce,
                              {b"S": "d"}, max_bytes, deadline)
        return reply.number(0), reply.payload

    def kill(self, pgid: int, deadline: float) -> bool:
        """SIGKILL a process group (a builtin in the server: works with the process table full); whether any process
        was there to signal."""
        nonce = new_nonce()
        return self._request(request_line(b"k %s %d" % (nonce, pgid)), nonce, {b"K": "d"}, 0,
                             deadline).number(0) == 0

    def kill_agent_processes(self, deadline: float) -> tuple[int, int, int]:
        """SIGKILL every process of the agent's uid; (how many were killed, forks the pids limit refused so far, how
        many were still found in the last pass: non-zero, some may be left)."""
        nonce = new_nonce()
        reply = self._request(request_line(b"K %s" % nonce), nonce, {b"K": "ddd"}, 0, deadline)
        return reply.number(0), reply.number(1), reply.number(2)

    def close(self) -> None:
        """End the server (EOF on its stdin) and drop the link. Never raises."""
        self.broken = True
        self.link.close()
