"""A small pool of exec channels: one channel serves one request at a time, a batch of tool calls runs at once.

Channels are created lazily up to `max_size`; a channel that errs is discarded, never returned.
"""
from __future__ import annotations

import threading
from typing import Callable

from .channel import Channel
from .errors import SandboxError


class ChannelPool:
    def __init__(self, factory: Callable[[], Channel], max_size: int = 8) -> None:
        self._factory = factory
        self._max = max_size
        self._idle: list[Channel] = []
        self._count = 0            # channels alive: idle + lent out + being created
        self._closed = False
        self._cond = threading.Condition()

    def acquire(self, block: bool = True) -> Channel | None:
        """An idle channel, a new one while under the limit, else wait (or None when not blocking)."""
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        raise SandboxError("sandbox is closed")
                    if self._idle:
                        channel = self._idle.pop()
                        break
                    if self._count < self._max:
                        self._count += 1
                        channel = None
                        break
                    if not block:
                        return None
                    self._cond.wait()
            if channel is None:
                try:
                    return self._factory()
                except BaseException:
                    self._forget_one()
                    raise
            if channel.is_idle_clean():
                return channel
            self.discard(channel)   # its server died while idle (e.g. the agent killed it): make a new one

    def grow(self) -> None:
        """Add one idle channel if under the limit; for warming up off the request path. Never raises."""
        with self._cond:
            if self._closed or self._count >= self._max:
                return
            self._count += 1
        try:
            channel = self._factory()
        except BaseException:
            self._forget_one()
            return
        self.release(channel)

    def release(self, channel: Channel) -> None:
        if channel.broken:
            self.discard(channel)
            return
        with self._cond:
            if self._closed:
                channel.close()
                self._count -= 1
            else:
                self._idle.append(channel)
            self._cond.notify()

    def discard(self, channel: Channel) -> None:
        channel.close()
        self._forget_one()

    def _forget_one(self) -> None:
        with self._cond:
            self._count -= 1
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._cond.notify_all()
        for channel in idle:
            channel.close()
