"""A running job's writes outlast an outage of its job store.

A Redis that restarts (a deploy, a crash, its host rebooting) is unreachable for seconds. A running job's agent needs
no store meanwhile, and its lease is renewed at the next poll that reaches it; but the writes that end the job (its
artifacts, result.json, its end, its log records) used to be tried once, so every job that ended in those seconds
failed with its work done. Here such a write is tried again, with a growing pause, while the store cannot be reached,
until the job's own deadline (its start plus --timeout and the grace the runner grants it), and never less than
OUTAGE_MIN_S after the outage began: a job ending near its limit still outlasts a restart. An error that is not an
outage (a job the store no longer knows, an artifact too large) is raised at once. A command waiting on a job waits
through an outage as well (WaitingThrough).
"""
from __future__ import annotations

import hashlib
import logging
import sys
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, TypeVar, cast

from pid.jobs.store import Store

log = logging.getLogger("pid.worker")

OUTAGE_MIN_S = 60.0   # the least a write waits for the store to come back, whatever the job's deadline
PAUSE_MAX_S = 5.0     # between two tries, at most
WAIT_OUTAGE_S = 300.0  # how long a command waiting on a job waits out its store's outage

T = TypeVar("T")

TOKEN_KEPT_S = 600   # how long the store remembers a script's run by its token, at least


@dataclass
class _Write:
    """The write Patience is trying (again) in this thread."""
    id: str
    deadline: float      # (time.monotonic()) Patience's: as long as its tokens are kept
    scripts: int = 0     # the store scripts it has run in this try


_WRITE: ContextVar[_Write | None] = ContextVar("pid_patient_write", default=None)


def call_token(*request: str) -> tuple[str, int]:
    """The token a store script's run is known by, and for how long the store keeps it (jobs/redis_lua/once.lua: a
    run with a token already seen returns the first one's result and does nothing). Fresh, except in a write
    Patience tries again: there the same request, made at the same point of the write, gets the same token, kept as
    long as Patience may try, so a write that ran but whose reply was lost (the store went away just then) is not
    done twice when the store is back."""
    write = _WRITE.get()
    if write is None:
        return uuid.uuid4().hex, TOKEN_KEPT_S
    write.scripts += 1
    digest = hashlib.blake2b(chr(0).join(request).encode(), digest_size=8).hexdigest()
    kept = max(TOKEN_KEPT_S, int(write.deadline - time.monotonic() + OUTAGE_MIN_S) + 60)
    return f"{write.id}.{write.scripts}.{digest}", kept


def _as_one_write(state: _Write, write: Callable[[], T]) -> T:
    state.scripts = 0
    token = _WRITE.set(state)
    try:
        return write()
    finally:
        _WRITE.reset(token)


def transient(exc: BaseException) -> bool:
    """The store could not be reached (refused, reset, timed out, still loading its data), as opposed to refusing
    the request itself."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    redis_errors = sys.modules.get("redis.exceptions")   # (not loaded: not a Redis error; `pid run` has no Redis)
    return redis_errors is not None and isinstance(exc, (redis_errors.ConnectionError, redis_errors.TimeoutError))


def refused_credentials(exc: BaseException) -> bool:
    """The store refused pid's password (redis-py makes that a ConnectionError, so `transient` counts it): a command
    starting up says so rather than wait for it."""
    redis_errors = sys.modules.get("redis.exceptions")
    return redis_errors is not None and isinstance(exc, redis_errors.AuthenticationError)


class Patience:
    """How long one job's writes (or one read, `who` says what it is for the log) wait for its store: until
    `deadline` (time.monotonic()), at least OUTAGE_MIN_S."""

    def __init__(self, job_id: str, deadline: float, who: str | None = None) -> None:
        self.who, self.deadline = who or f"job {job_id}", deadline

    def call(self, what: str, write: Callable[[], T]) -> T:
        """write(), tried again while the store is unreachable and time is left; its result, or its last error."""
        pause = 0.25
        gave_up_at: float | None = None
        state = _Write(uuid.uuid4().hex, self.deadline)   # (call_token: every try is the same write)
        while True:
            try:
                done = _as_one_write(state, write)
            except Exception as exc:
                if not transient(exc):
                    raise
                now = time.monotonic()
                if gave_up_at is None:
                    gave_up_at = max(self.deadline, now + OUTAGE_MIN_S)
                    log.warning("%s: the job store is unreachable (%s): %s waits for it, %.0fs at most",
                                self.who, first_line(exc), what, gave_up_at - now)
                if now + pause > gave_up_at:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, PAUSE_MAX_S)
                continue
            if gave_up_at is not None:
                log.warning("%s: the job store is back: %s done", self.who, what)
            return done


class WaitingThrough:
    """A command waiting on a job (`submit --wait`, `result --wait`, `logs -f`) waits through an outage of the
    store too: one line when it begins, one when it ends, and after WAIT_OUTAGE_S of it the command gives up with the
    store's error, as one that could not reach it at all."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.since: float | None = None   # time.monotonic() when the outage began

    def bear(self, exc: BaseException) -> bool:
        """Whether to wait on after `exc`: true for an unreachable store while the outage is young enough."""
        if not transient(exc):
            return False
        now = time.monotonic()
        if self.since is None:
            self.since = now
            self.say(f"the job store is unreachable ({first_line(exc)}): waiting for it ({WAIT_OUTAGE_S:.0f}s at "
                     "most; Ctrl-C stops waiting, the job goes on)")
        return now - self.since < WAIT_OUTAGE_S

    def reached(self) -> None:
        """The store answered: an outage, if any, is over."""
        if self.since is not None:
            self.say(f"the job store is back (after {time.monotonic() - self.since:.0f}s)")
            self.since = None


class _PatientStore:
    """A store whose every call is made with Patience (see patient())."""

    def __init__(self, store: Store, patience: Patience) -> None:
        self._store, self._patience = store, patience

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            streams = [(a, a.tell()) for a in (*args, *kwargs.values()) if hasattr(a, "seek") and hasattr(a, "tell")]

            def once() -> Any:
                for stream, at in streams:   # a try that failed midway read some of it: the next sends it all
                    stream.seek(at)
                return attribute(*args, **kwargs)
            return self._patience.call(name, once)
        return call


def patient(store: Store, patience: Patience) -> Store:
    """`store` as one running job writes to it: a call that cannot reach it is made again until `patience` runs out,
    its stream arguments rewound first. (A call that returns an iterator is retried only until it returns: reading
    one is the caller's.)"""
    return cast(Store, _PatientStore(store, patience))


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]
