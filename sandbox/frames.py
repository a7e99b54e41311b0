"""Reader for Docker's multiplexed attach stream (non-TTY exec).

Each frame is an 8-byte header — stream type (1 stdout, 2 stderr), three zero bytes, big-endian payload
length — then the payload. We keep stdout in a buffer the channel parses line by line; stderr is kept only
as a short tail for error messages (the channel server sends nothing useful there).
"""
from __future__ import annotations

import select
import socket
import struct
import time

_HEADER = struct.Struct(">BxxxL")
_STDERR_KEEP = 4096


class StreamClosed(EOFError):
    """The server side of the stream ended (process exited or container gone)."""


class FrameReader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.out = bytearray()       # stdout payload not yet consumed by the caller
        self.err_tail = bytearray()  # last bytes of stderr, for diagnostics
        self._raw = bytearray()      # bytes received but not yet split into frames
        self.closed = False

    def fill(self, timeout: float | None) -> bool:
        """Receive what is available, waiting at most `timeout` seconds (None: forever).

        Returns False on timeout. Raises StreamClosed at end of stream.
        """
        if self.closed:
            raise StreamClosed("exec stream closed")
        if timeout is not None:
            ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
            if not ready:
                return False
        chunk = self.sock.recv(262144)
        if not chunk:
            self.closed = True
            raise StreamClosed("exec stream closed")
        raw = self._raw
        raw += chunk
        pos = 0
        end = len(raw)
        while end - pos >= 8:
            kind, size = _HEADER.unpack_from(raw, pos)
            if end - pos - 8 < size:
                break
            payload = raw[pos + 8:pos + 8 + size]
            if kind == 2:
                self.err_tail += payload
                del self.err_tail[:-_STDERR_KEEP]
            else:
                self.out += payload
            pos += 8 + size
        del raw[:pos]
        return True

    def has_pending(self) -> bool:
        """True when bytes (or EOF) are waiting on the socket: an idle channel should have none."""
        if self.out or self.closed:
            return True
        ready, _, _ = select.select([self.sock], [], [], 0)
        return bool(ready)

    def readline(self, deadline: float | None = None) -> bytes | None:
        """One stdout line without its newline; None when `deadline` (time.monotonic) passes first."""
        return self.read_until(b"\n", deadline)

    def read_until(self, marker: bytes, deadline: float | None = None) -> bytes | None:
        """Stdout bytes up to `marker` (consumed, not returned); None when `deadline` passes first."""
        start = 0
        while True:
            idx = self.out.find(marker, start)
            if idx >= 0:
                data = bytes(self.out[:idx])
                del self.out[:idx + len(marker)]
                return data
            start = max(0, len(self.out) - len(marker) + 1)
            if not self.fill(None if deadline is None else deadline - time.monotonic()):
                return None
