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
        self._warming = 0          # being created by grow(), for whoever asks first
        self._promised = 0         # callers waiting for one of those
        self._closed = False
        self._cond = threading.Condition()

    def acquire(self, block: bool = True) -> Channel | None:
        """An idle channel, one that is warming up, a new one while under the limit, else wait (or None when not
        blocking)."""
        channel: Channel | None
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        raise SandboxError("sandbox is closed")
                    if self._idle:
                        channel = self._idle.pop()
                        break
                    if block and self._warming > self._promised:   # one is on its way: no second docker exec
                        self._promised += 1
                        try:
                            self._cond.wait()
                        finally:
                            self._promised -= 1
                        continue
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

    def take_idle(self) -> Channel | None:
        """An idle channel if there is one right now; never creates one, never waits."""
        with self._cond:
            if self._closed or not self._idle:
                return None
            channel = self._idle.pop()
        if channel.is_idle_clean():
            return channel
        self.discard(channel)
        return None

    def grow(self, factory: Callable[[], Channel | None] | None = None) -> None:
        """Add one idle channel if under the limit; for warming up off the request path. Never raises.
        `factory` instead of the pool's may have none to give (None)."""
        with self._cond:
            if self._closed or self._count >= self._max:
                return
            self._count += 1
            self._warming += 1
        try:
            channel = (factory or self._factory)()
        except BaseException:
            channel = None
        if channel is None:
            with self._cond:
                self._warming -= 1
            self._forget_one()
            return
        self.release(channel, warmed=True)

    def release(self, channel: Channel, *, warmed: bool = False) -> None:
        """Give a channel back (or, from grow, a new one: in the same step its promise is kept)."""
        if channel.broken and not warmed:
            self.discard(channel)
            return
        with self._cond:
            self._warming -= warmed
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
