"""A deadline that acts from its own thread: the one thing that still works when every other wait is stuck.

The runner arms it with "remove the container" for the job's wall clock plus a grace period, and again for the
collection of artifacts. Removing the container ends every read of its streams, so whatever was blocked returns.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._action: Callable[[], None] | None = None
        self._stopped = False
        self.fired: str | None = None          # the label of the deadline that ran out, once one has
        self._label = ""
        self._thread = threading.Thread(target=self._watch, name="pid-watchdog", daemon=True)
        self._thread.start()

    def arm(self, seconds: float, action: Callable[[], None], label: str) -> None:
        """Run `action` in `seconds` unless re-armed or disarmed first."""
        with self._cond:
            self._deadline = time.monotonic() + max(0.0, seconds)
            self._action, self._label = action, label
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = self._action = None
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (self._deadline is None or time.monotonic() < self._deadline):
                    self._cond.wait(None if self._deadline is None else self._deadline - time.monotonic())
                if self._stopped:
                    return
                action, self.fired = self._action, self._label
                self._deadline = self._action = None
            log.warning("deadline passed (%s): removing the container", self.fired)
            try:
                if action is not None:
                    action()
            except Exception:
                log.exception("watchdog action failed")
