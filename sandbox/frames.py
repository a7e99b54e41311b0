"""Reader for Docker's multiplexed attach stream (non-TTY exec), bounded in bytes and in time.

Each frame is an 8-byte header — stream type (1 stdout, 2 stderr), three zero bytes, big-endian payload
length — then the payload. Frames are parsed incrementally (a frame's payload is consumed as it arrives, whatever
length its header claims), stdout goes to a buffer the channel parses, and stderr is kept only as a short tail for
error messages. The other end may be hostile: every read names the most it will accept, and more is an error.
"""
from __future__ import annotations

import select
import socket
import struct
import time

_HEADER = struct.Struct(">BxxxL")
_STDERR_KEEP = 4096
RECV_SIZE = 262144


class StreamClosed(EOFError):
    """The server side of the stream ended (process exited or container gone)."""


class ReplyTooLarge(ValueError):
    """The server sent more than the request allows: a confused or hostile server."""


class FrameReader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.out = bytearray()       # stdout payload not yet consumed by the caller
        self.err_tail = bytearray()  # last bytes of stderr, for diagnostics
        self._header = bytearray()   # a frame header being received
        self._kind = 1               # stream of the frame being received
        self._left = 0               # payload bytes of that frame still to come
        self.closed = False

    def fill(self, timeout: float) -> bool:
        """Receive what is available, waiting at most `timeout` seconds.

        Returns False on timeout. Raises StreamClosed at end of stream. Adds at most RECV_SIZE bytes.
        """
        if self.closed:
            raise StreamClosed("exec stream closed")
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not ready:
            return False
        chunk = self.sock.recv(RECV_SIZE)
        if not chunk:
            self.closed = True
            raise StreamClosed("exec stream closed")
        view = memoryview(chunk)
        while view:
            if self._left == 0:
                need = 8 - len(self._header)
                self._header += view[:need]
                view = view[need:]
                if len(self._header) < 8:
                    break
                self._kind, self._left = _HEADER.unpack(self._header)
                self._header.clear()
                continue
            payload = view[:self._left]
            view = view[self._left:]
            self._left -= len(payload)
            if self._kind == 2:
                self.err_tail += payload
                del self.err_tail[:-_STDERR_KEEP]
            else:
                self.out += payload
        return True

    def has_pending(self) -> bool:
        """True when bytes (or EOF) are waiting on the socket: an idle channel should have none."""
        if self.out or self.closed:
            return True
        ready, _, _ = select.select([self.sock], [], [], 0)
        return bool(ready)

    def read_until(self, marker: bytes, deadline: float, limit: int) -> bytes | None:
        """Stdout bytes up to `marker` (consumed, not returned); None when `deadline` (time.monotonic) passes first.

        Raises ReplyTooLarge when more than `limit` bytes come before the marker.
        """
        start = 0
        while True:
            idx = self.out.find(marker, start)
            if idx >= 0:
                if idx > limit:
                    raise ReplyTooLarge(f"reply of over {limit} bytes")
                data = bytes(self.out[:idx])
                del self.out[:idx + len(marker)]
                return data
            if len(self.out) > limit + len(marker):
                raise ReplyTooLarge(f"reply of over {limit} bytes")
            start = max(0, len(self.out) - len(marker) + 1)
            if not self.fill(deadline - time.monotonic()):
                return None
