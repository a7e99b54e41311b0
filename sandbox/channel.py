"""One exec channel: a long-lived `channel.sh` server inside the container, spoken to over an attached stream.

Why: `docker exec` per tool call costs ~60 ms; a request on a warm channel costs about a millisecond.
A channel serves one request at a time (the pool hands it to one caller); the wire format is described at the
top of channel.sh. Any desync or broken stream raises SandboxError and the caller must discard the channel.
"""
from __future__ import annotations

import importlib.resources
import io
import re
import secrets
import socket
import tarfile
import time
from dataclasses import dataclass
from typing import Mapping

from .config import BASE_ENV
from .errors import SandboxError
from .frames import FrameReader, StreamClosed

SCRIPT = importlib.resources.files(__package__).joinpath("channel.sh").read_bytes()
SCRIPT_PATH = "/tmp/.pid/channel.sh"   # installed once per container; keeps `ps` output short for the agent

# Prefer bash (faster paths), fall back to POSIX sh. stderr goes nowhere: nothing may reach the stream before
# the host's first request, and the protocol reports errors in-band.
_BOOT = ('exec 2>/dev/null; if command -v bash >/dev/null 2>&1; then exec bash "$@"; fi; exec sh "$@"')


def install_script(api, container_id: str) -> None:
    """Put channel.sh into the container (a tar stream through the API: no mount, no exec)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folder = tarfile.TarInfo(".pid")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(folder)
        script = tarfile.TarInfo(".pid/channel.sh")
        script.size, script.mode = len(SCRIPT), 0o500
        tar.addfile(script, io.BytesIO(SCRIPT))
    try:
        api.put_archive(container_id, "/tmp", buffer.getvalue())
    except Exception as exc:
        raise SandboxError(f"cannot install the exec channel script: {exc}") from exc

_STARTUP_TIMEOUT = 30.0
_REPLY_TIMEOUT = 30.0   # for requests that must answer promptly (start, kill, errors)

_BUILTIN_WRITE_MAX = 32768  # above this one `head -c` fork is cheaper than bash decoding the data

_ESCAPE = re.compile(rb"[\\\x00-\x20\x7f]")


def escape_field(value: str | bytes) -> bytes:
    """Encode free text as one protocol field: no space, tab or newline; decoded by `printf %b`."""
    raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    if b"\0" in raw:
        raise ValueError("NUL bytes cannot be passed to a shell")
    return _ESCAPE.sub(lambda m: b"\\\\" if m.group() == b"\\" else b"\\0%03o" % m.group()[0], raw)


def env_snippet(env: Mapping[str, str] | None) -> bytes:
    """`export K='v' ...` for the command's environment, or "-" for none."""
    if not env:
        return b"-"
    parts = []
    for key, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"invalid environment variable name: {key!r}")
        parts.append(f"{key}='" + str(value).replace("'", "'\\''") + "'")
    return escape_field("export " + " ".join(parts))


class ChannelClosed(SandboxError):
    """The channel's server is gone (killed, or the container stopped)."""


@dataclass
class ExecReply:
    exit_code: int
    total_lines: int
    total_bytes: int
    tail: bytes               # the last tail_bytes bytes of the output
    kept_path: str | None     # the output file, kept when the output is longer than the tail


_ERRNO = {
    b"ENOENT": FileNotFoundError,
    b"EISDIR": IsADirectoryError,
    b"EACCES": PermissionError,
    b"ENOTDIR": NotADirectoryError,
    b"EINVAL": OSError,              # not a regular file (FIFO, device): refused rather than blocking
}


class Channel:
    def __init__(self, api, container_id: str, channel_id: int, workdir: str) -> None:
        self.channel_id = channel_id
        try:
            exec_id = api.exec_create(
                container_id, ["/bin/sh", "-c", _BOOT, "pid-boot", SCRIPT_PATH, str(channel_id), workdir],
                stdin=True, stdout=True, stderr=True, tty=False, environment=dict(BASE_ENV), workdir="/")["Id"]
            self._response = api.exec_start(exec_id, socket=True)
        except Exception as exc:  # docker.errors.* and transport errors alike
            raise SandboxError(f"cannot start exec channel: {exc}") from exc
        self.sock: socket.socket = getattr(self._response, "_sock", self._response)
        self.sock.settimeout(None)
        self.reader = FrameReader(self.sock)
        self.broken = False
        try:
            self._send(b"h\n")
            hello = self._line(time.monotonic() + _STARTUP_TIMEOUT).split()
        except BaseException:
            self.close()
            raise
        if len(hello) != 3 or hello[0] != b"R":
            self.close()
            raise SandboxError(f"exec channel did not start (got {hello!r}); does the image have /bin/sh?")
        self.shell = hello[1].decode()

    # -- transport -------------------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise ChannelClosed(f"exec channel broken: {exc}") from exc

    def _line(self, deadline: float | None) -> bytes:
        line = self._try(self.reader.readline, deadline)
        if line is None:
            raise SandboxError("exec channel did not answer in time")
        return line

    def _try(self, fn, deadline):
        try:
            return fn(deadline)
        except StreamClosed as exc:
            detail = self.reader.err_tail.decode("utf-8", "replace").strip()
            raise ChannelClosed("exec channel closed (container stopped?)" + (f": {detail}" if detail else "")) from exc
        except OSError as exc:
            raise SandboxError(f"exec channel broken: {exc}") from exc

    def is_idle_clean(self) -> bool:
        """An idle channel has nothing to read; anything there (or EOF) means its server is gone or confused."""
        try:
            return not self.reader.has_pending()
        except OSError:
            return False

    def _raw_until_nonce(self, marker: bytes, deadline: float | None) -> bytes:
        """Raw reply data up to `marker` (the request's nonce and what follows it), consumed."""
        data = self._try(lambda d: self.reader.read_until(marker, d), deadline)
        if data is None:
            raise SandboxError("exec channel did not answer in time")
        return data

    # -- requests ----------------------------------------------------------------------------------------
    def start_exec(self, command: str, env: Mapping[str, str] | None, tail_bytes: int,
                   keep_lines: int | None = None, keep_bytes: int | None = None) -> tuple[int, str]:
        """Start the command; returns (pgid, output file). Collect the result with `wait_exec`."""
        cmd = escape_field(command) if command else b":"
        self._nonce = secrets.token_hex(12).encode()
        self._tail_bytes = max(0, tail_bytes)
        self._keep_lines = keep_lines
        self._keep_bytes = keep_bytes
        self._send(b"x %d %s %s %s\n" % (self._tail_bytes, self._nonce, env_snippet(env), cmd))
        parts = self._line(time.monotonic() + _REPLY_TIMEOUT).split()
        if len(parts) != 3 or parts[0] != b"P":
            raise SandboxError(f"exec channel: unexpected reply {parts!r}")
        self._out_path = parts[2].decode()
        return int(parts[1]), self._out_path

    def wait_exec(self, deadline: float | None) -> ExecReply | None:
        """The finished command's result, or None if `deadline` passes first (the command keeps running)."""
        # The server sends the first tail_bytes+1 bytes, then "<nonce> <rc>": fewer means that is the whole output.
        head = self._try(lambda d: self.reader.read_until(self._nonce + b" ", d), deadline)
        if head is None:
            return None
        status = self._line(time.monotonic() + _REPLY_TIMEOUT)
        if not status.isdigit():
            raise SandboxError(f"exec channel: unexpected reply {status[:200]!r}")
        exit_code = int(status)
        wanted = (self._keep_lines is not None and head.count(b"\n") > self._keep_lines) or \
            (self._keep_bytes is not None and len(head) > self._keep_bytes)
        if len(head) <= self._tail_bytes and not wanted:
            tail, newlines, total, kept = head, head.count(b"\n"), len(head), None
        else:  # keep the file ("c" takes it off the delete list) and count the whole of it
            nonce = secrets.token_hex(12).encode()
            self._send(b"c %d %s %s\n" % (max(1, self._tail_bytes), nonce, escape_field(self._out_path)))
            counts = self._line(time.monotonic() + _REPLY_TIMEOUT).split()
            if len(counts) != 3 or counts[0] != b"C":
                raise SandboxError(f"exec channel: unexpected reply {counts!r}")
            tail = self._raw_until_nonce(nonce + b"\n", time.monotonic() + _REPLY_TIMEOUT)
            newlines, total, kept = int(counts[1]), int(counts[2]), self._out_path
        lines = newlines + (1 if tail and not tail.endswith(b"\n") else 0)
        tail = tail[max(0, len(tail) - self._tail_bytes):] if self._tail_bytes else b""
        return ExecReply(exit_code=exit_code, total_lines=lines, total_bytes=total, tail=tail, kept_path=kept)

    def read_file(self, path: str, max_bytes: int | None) -> bytes:
        limit = b"-" if max_bytes is None else b"%d" % max(0, max_bytes)
        nonce = secrets.token_hex(12).encode()
        self._send(b"r %s %s %s\n" % (limit, nonce, escape_field(path)))
        head = self._line(time.monotonic() + _REPLY_TIMEOUT)
        if head.startswith(b"E "):
            raise _ERRNO.get(head[2:], PermissionError)(f"{head[2:].decode()}: {path}")
        if head != b"D":
            raise SandboxError(f"exec channel: unexpected reply {head[:200]!r}")
        data = self._raw_until_nonce(nonce + b" ", None)
        status = self._line(time.monotonic() + _REPLY_TIMEOUT)
        if status != b"0":
            raise SandboxError(f"cannot read {path} (status {status.decode()})")
        return data

    def write_file(self, path: str, data: bytes) -> None:
        # Small data is read and decoded by bash builtins (no fork); anything else is copied by `head -c`.
        if self.shell == "bash" and len(data) <= _BUILTIN_WRITE_MAX:
            payload = data.replace(b"\\", b"\\\\").replace(b"\0", b"\\0000")
            op = b"W"
        else:
            payload, op = data, b"w"
        self._send(b"%s %d %s\n" % (op, len(payload), escape_field(path)) + payload)
        reply = self._line(None)
        if reply.startswith(b"E "):
            raise _ERRNO.get(reply[2:], PermissionError)(f"{reply[2:].decode()}: {path}")
        if reply != b"W 0":
            # The server may not have consumed all of `data`: the stream is out of step.
            self.broken = True
            raise SandboxError(f"cannot write {path} (status {reply[2:].decode()})")

    def tail(self, path: str, offset: int, max_bytes: int) -> tuple[int, bytes]:
        """(current size, bytes appended since `offset`, at most the last `max_bytes` of them)."""
        nonce = secrets.token_hex(12).encode()
        self._send(b"t %d %d %s %s\n" % (offset, max_bytes, nonce, escape_field(path)))
        head = self._line(time.monotonic() + _REPLY_TIMEOUT).split()
        if len(head) != 2 or head[0] != b"S":
            raise SandboxError(f"exec channel: unexpected reply {head!r}")
        data = self._raw_until_nonce(nonce + b"\n", time.monotonic() + _REPLY_TIMEOUT)
        return int(head[1]), data

    def kill(self, pgid: int) -> None:
        self._send(b"k %d\n" % pgid)
        self._line(time.monotonic() + _REPLY_TIMEOUT)

    def close(self) -> None:
        """End the server (EOF on its stdin) and drop the stream. Never raises."""
        self.broken = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for obj in (self.sock, self._response):
            try:
                obj.close()
            except Exception:
                pass
