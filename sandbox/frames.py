"""Readers for a channel server's replies, bounded in bytes and in time: Docker's multiplexed attach stream (non-TTY
exec), or a FIFO's raw bytes.

In the attach stream each frame is an 8-byte header — stream type (1 stdout, 2 stderr), three zero bytes, big-endian
payload length — then the payload. Frames are parsed incrementally (a frame's payload is consumed as it arrives,
whatever length its header claims), stdout goes to a buffer the channel parses, and stderr is kept only as a short
tail for error messages. The other end may be hostile: every read names the most it will accept, and more is an error.
"""
from __future__ import annotations

import os
import select
import socket
import struct
import time

_HEADER = struct.Struct(">BxxxL")
_STDERR_KEEP = 4096
RECV_SIZE = 65536   # one read's buffer: below malloc's mmap threshold (a bigger one is mapped and unmapped per read)


class StreamClosed(EOFError):
    """The server side of the stream ended (process exited or container gone)."""


class ReplyTooLarge(ValueError):
    """The server sent more than the request allows: a confused or hostile server."""


def wait_ready(fd: int, events: int, timeout: float) -> bool:
    """Whether fd is ready for `events` (or hung up) within `timeout` seconds. poll, not select: a busy worker holds
    descriptors numbered past select's 1024."""
    poller = select.poll()
    poller.register(fd, events)
    return bool(poller.poll(max(0.0, timeout) * 1000.0))


class BoundedReader:
    """Replies parsed out of what a (possibly hostile) server wrote: `fill` receives, `read_until` consumes."""

    def __init__(self) -> None:
        self.out = bytearray()       # reply bytes not yet consumed by the caller
        self.err_tail = bytearray()  # last bytes of the server's stderr (attach streams only), for diagnostics
        self.closed = False

    def fileno(self) -> int:
        raise NotImplementedError

    def _receive(self) -> bytes | None:
        """One read of what is ready: b"" at end of stream, None when nothing was there after all."""
        raise NotImplementedError

    def _take(self, chunk: bytes) -> None:
        self.out += chunk

    def fill(self, timeout: float) -> bool:
        """Receive what is available, waiting at most `timeout` seconds.

        Returns False on timeout. Raises StreamClosed at end of stream. Adds at most RECV_SIZE bytes.
        """
        if self.closed:
            raise StreamClosed("exec stream closed")
        if not wait_ready(self.fileno(), select.POLLIN, timeout):
            return False
        chunk = self._receive()
        if chunk is None:
            return True
        if not chunk:
            self.closed = True
            raise StreamClosed("exec stream closed")
        self._take(chunk)
        return True

    def has_pending(self) -> bool:
        """True when bytes (or EOF) are waiting: an idle channel should have none."""
        if self.out or self.closed:
            return True
        return wait_ready(self.fileno(), select.POLLIN, 0.0)

    def read_until(self, marker: bytes, deadline: float, limit: int) -> bytes | None:
        """Reply bytes up to `marker` (consumed, not returned); None when `deadline` (time.monotonic) passes first.

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

    def read_exact(self, size: int, deadline: float) -> bytes | None:
        """The next `size` reply bytes (consumed); None when `deadline` passes first."""
        while len(self.out) < size:
            if not self.fill(deadline - time.monotonic()):
                return None
        data = bytes(self.out[:size])
        del self.out[:size]
        return data


class FrameReader(BoundedReader):
    """Docker's attach stream: stdout frames are the replies, stderr frames only a kept tail."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock
        self._header = bytearray()   # a frame header being received
        self._kind = 1               # stream of the frame being received
        self._left = 0               # payload bytes of that frame still to come

    def fileno(self) -> int:
        fd = self.sock.fileno()
        if fd < 0:   # closed (poll would ignore it and wait the whole timeout)
            raise StreamClosed("exec stream closed")
        return fd

    def _receive(self) -> bytes | None:
        return self.sock.recv(RECV_SIZE)

    def _take(self, chunk: bytes) -> None:
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


class PipeReader(BoundedReader):
    """A FIFO the server writes its replies to (its stdout), raw: no framing, no stderr."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd

    def fileno(self) -> int:
        if self.fd < 0:   # the link closed it: its number may already name another file
            raise StreamClosed("exec pipe closed")
        return self.fd

    def forget(self) -> None:
        """The descriptor is about to be closed: nothing reads from its number again."""
        self.fd = -1
        self.closed = True

    def _receive(self) -> bytes | None:
        try:
            return os.read(self.fd, RECV_SIZE)
        except BlockingIOError:   # (select said ready, yet nothing came: the FIFO is non-blocking, never wait here)
            return None
