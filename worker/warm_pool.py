"""A worker's warm pool: sandboxes created, hardened, started and greeted before any job asks, so that a job of a
class the worker served lately skips DockerSandbox.create (~0.3 s of its start).

A sandbox's class is its SandboxConfig without what is the job's own (its id, attempt, and the clone limit its
hand-over sets): image, limits, user, disk, runtime, workspace kind, and its time to live to within a factor of two
(ttl_band): a ready sandbox outlives its class's longest job by the pool's idle time, so a taken one lives at most
about twice its job's time to live plus that, never a week for a short job because a long one ran lately.

The pool holds at most `sizes.shared` ready sandboxes in all, shared among the classes jobs asked for most recently
(at most that many classes: the least recently used one goes first, its ready sandboxes removed); an image with a size
of its own (`--pool IMAGE=N`) has its own N the same way, for its classes alone. A class no job asked for in IDLE_S is
drained. So a tasks file whose every job is a class of its own makes at most one sandbox per job it starts,
never a growing heap. A ready sandbox is made by the job's own creation path (DockerSandbox.create: the same
hardening, limits, disks and runtime), with a job id of its own (`pool-...`), the label pid.pool (this worker
process: a SIGKILLed worker's are removed by the next reap on this host, see sandbox/reaper.py reap_orphan_pools) and
a time to live that covers the pool's idle life and the class's jobs.

Taking: a container's labels cannot change, so a job that takes one renames it (config.taken_name): cancel, the sweep
of a lost attempt and a retry find a job's containers by that name as by label (reaper.remove_job_containers). A
sandbox serves one job and is removed as the job ends, like any other; one whose time left is shorter than the job
needs (or far longer: longest_life), or whose image tag moved, is not given (it is removed). The pool refills in one
thread, one creation at a time, and waits while any job of this worker creates its own sandbox: a job's creation
comes first; that thread also removes what the pool lets go. On a clean stop the ready ones are removed (close(),
from the worker's shutdown, never a finaliser).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Iterator

import docker
import docker.errors
import requests.exceptions

from pid.jobs.identity import process_mark
from pid.sandbox import DockerProvider, DockerSandbox, SandboxConfig
from pid.sandbox.config import POOL_JOB_PREFIX, taken_name
from pid.sandbox.processes import cgroup_dir, read_small
from pid.settings import PoolSizes

log = logging.getLogger("pid.worker")

IDLE_S = 300.0        # a class no job asked for this long is drained
SPARE_S = 60.0        # a ready sandbox must outlive the job's own time to live by this much to be given
RETRY_S = 30.0        # after a failed creation, the class waits this long before the next
TICK_S = 5.0          # the refill thread's look at idle classes (a wait, not a poll of the engine)
STOP_WAIT_S = 60.0    # for a creation under way when the worker stops

Key = tuple[Any, ...]


def class_of(config: SandboxConfig) -> Key:
    """The sandbox's class: its config without the job's own fields (max_workspace bounds a clone into the sandbox:
    the creation does not use it, the hand-over gives the job's own) and without the pool's label; its time to live
    by band."""
    blank = dataclasses.replace(config, job_id="", attempt=0, ttl_s=0.0, pool="", max_workspace=0)
    return dataclasses.astuple(blank) + (ttl_band(config.ttl_s),)


def ttl_band(ttl_s: float) -> int:
    """Times to live in (2**(n-1), 2**n] seconds are band n: one class's longest is under twice its shortest."""
    return math.ceil(math.log2(max(ttl_s, 1.0)))


def longest_life(ttl_s: float, idle_s: float) -> float:
    """The most time left a ready sandbox may have to be given to a job of this time to live: what its class's
    longest job (under twice this one) plus the pool's idle time and margin can make, no more."""
    return 2 * ttl_s + idle_s + 2 * SPARE_S


@dataclass
class Ready:
    sandbox: DockerSandbox
    expires: float          # wall clock: the container's own end (its time to live from its creation)
    memory: int | None      # bytes its cgroup used once ready (None: not readable here)


@dataclass
class Wanted:
    """A class the worker served lately: the config to make its sandboxes from, and when a job last asked."""
    template: SandboxConfig
    ttl_s: float
    used_at: float
    ready: list[Ready] = field(default_factory=list)
    creating: bool = False
    failed_at: float = 0.0


class WarmPool:
    """At most `sizes` ready sandboxes, over the classes used most recently. Thread-safe; one refill thread."""

    def __init__(self, sizes: PoolSizes | int, *, idle_s: float = IDLE_S,
                 create: Callable[[SandboxConfig], DockerSandbox] = DockerSandbox.create) -> None:
        self.sizes = PoolSizes(sizes) if isinstance(sizes, int) else sizes
        self.idle_s, self._create = idle_s, create
        self.identity = process_mark()   # (the pid.pool label: reaper.reap_orphan_pools)
        self._classes: dict[Key, Wanted] = {}
        self._to_close: list[DockerSandbox] = []   # let go: the refill thread removes them, off any job's path
        self._jobs_creating = 0
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._refill_loop, name="pid-warm-pool", daemon=True)

    def start(self) -> "WarmPool":
        self._thread.start()
        return self

    # -- the job's side ------------------------------------------------------------------------------------------
    def served(self, config: SandboxConfig) -> None:
        """A job of this class starts: keep its class ready (and long-lived enough for it)."""
        key, now = class_of(config), time.time()
        with self._cond:
            wanted = self._classes.get(key)
            if wanted is None:
                self._classes[key] = Wanted(config, config.ttl_s, now)
            else:
                wanted.used_at, wanted.ttl_s = now, max(wanted.ttl_s, config.ttl_s)
            self._drain(now)   # (a class pushed out by this one lets its ready sandboxes go now)
            self._cond.notify_all()

    def take(self, config: SandboxConfig) -> DockerSandbox | None:
        """A ready sandbox of the job's class, now the job's (renamed for it), or None: the job creates its own.
        What cannot be given is let go (the refill thread removes it: never on the job's path); after one the engine
        refuses (gone, renamed, another image behind the tag) the job does not try the next."""
        key = class_of(config)
        while True:
            with self._cond:
                wanted = self._classes.get(key)
                if self._closed or wanted is None or not wanted.ready:
                    return None
                ready = wanted.ready.pop(0)   # the oldest first: it has the least time left
                self._cond.notify_all()       # (one fewer ready: the refill thread makes another)
                left = ready.expires - time.time()
                if not config.ttl_s + SPARE_S <= left <= longest_life(config.ttl_s, self.idle_s):
                    self._to_close.append(ready.sandbox)   # too little time left (a newer one may have enough), or
                    continue                               # far more than the job's (not made for its class)
            if _hand_over(ready.sandbox, config):
                return ready.sandbox
            self._let_go(ready.sandbox)
            return None

    def _let_go(self, sandbox: DockerSandbox) -> None:
        """For the refill thread to remove; once the pool is closed (that thread gone), here."""
        with self._cond:
            if not self._closed:
                self._to_close.append(sandbox)
                self._cond.notify_all()
                return
        sandbox.close()

    @contextmanager
    def job_creating(self) -> Iterator[None]:
        """A job creates its own sandbox meanwhile: the pool makes none until it is done."""
        with self._cond:
            self._jobs_creating += 1
        try:
            yield
        finally:
            with self._cond:
                self._jobs_creating -= 1
                self._cond.notify_all()

    # -- what the heartbeat shows -----------------------------------------------------------------------------------
    def status(self) -> list[dict[str, Any]]:
        """Per image: the sandboxes ready, and the memory they used once ready (bytes, where readable)."""
        shown: dict[str, dict[str, Any]] = {}
        with self._cond:
            for wanted in self._classes.values():
                entry = shown.setdefault(wanted.template.image, {"image": wanted.template.image, "ready": 0,
                                                                  "memory": 0})
                entry["ready"] += len(wanted.ready)
                entry["memory"] += sum(r.memory or 0 for r in wanted.ready)
        return list(shown.values())

    # -- refilling ----------------------------------------------------------------------------------------------
    def _refill_loop(self) -> None:
        config: SandboxConfig | None = None
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    self._drain(time.time())
                    closing, self._to_close = self._to_close, []
                    key = None if self._jobs_creating or closing else self._next_class(time.time())
                    if key is not None or closing:
                        break
                    self._cond.wait(TICK_S)
                if key is not None:
                    wanted = self._classes[key]
                    wanted.creating = True
                    config = dataclasses.replace(wanted.template, job_id=f"{POOL_JOB_PREFIX}{uuid.uuid4().hex[:12]}",
                                                 attempt=0, ttl_s=wanted.ttl_s + self.idle_s + SPARE_S,
                                                 pool=self.identity)
            for sandbox in closing:
                sandbox.close()
            if key is not None and config is not None:
                self._make(key, config)

    def _targets(self) -> dict[Key, int]:
        """(Holding the lock.) How many ready sandboxes each class may have: each budget (the shared one, an image's
        own) divided among the at most that many of its classes used most recently (the most recent get the
        remainder); the others none."""
        budgets: dict[str, tuple[int, list[Key]]] = {}
        for key in sorted(self._classes, key=lambda k: self._classes[k].used_at, reverse=True):
            name, size = self.sizes.budget(self._classes[key].template.image)
            budgets.setdefault(name, (size, []))[1].append(key)
        targets: dict[Key, int] = {}
        for size, keys in budgets.values():
            recent = keys[:size]
            if recent:
                share, extra = divmod(size, len(recent))
                targets.update({key: share + (1 if n < extra else 0) for n, key in enumerate(recent)})
        return targets

    def _drain(self, now: float) -> None:
        """(Holding the lock.) Let go (into _to_close) of the classes idle too long or beyond their budget's most
        recent, of a class's ready sandboxes beyond its share (its oldest), and of those too short-lived for their
        class."""
        targets = self._targets()
        for key, wanted in list(self._classes.items()):
            keep = [r for r in wanted.ready if r.expires - now >= wanted.ttl_s + SPARE_S]
            if now - wanted.used_at > self.idle_s or key not in targets:
                keep = []
                del self._classes[key]   # (a creation under way for it is removed once made: see _make)
            keep = keep[max(0, len(keep) - targets.get(key, 0)):]   # (its newest: they have the most time left)
            self._to_close += [r.sandbox for r in wanted.ready if r not in keep]
            wanted.ready = keep

    def _next_class(self, now: float) -> Key | None:
        """(Holding the lock.) The class furthest below its share (the most recent of those), not failing lately."""
        targets = self._targets()
        short = [(targets[key] - len(w.ready), w.used_at, key) for key, w in self._classes.items()
                 if len(w.ready) < targets.get(key, 0) and not w.creating and now - w.failed_at >= RETRY_S]
        return max(short, key=lambda entry: entry[:2])[2] if short else None

    def _make(self, key: Key, config: SandboxConfig) -> None:
        start = time.time()
        try:
            sandbox = self._create(config)
        except Exception as exc:
            log.warning("warm pool: cannot make a sandbox of %s: %s (tried again in %.0f s)", config.image, exc,
                        RETRY_S)
            with self._cond:
                wanted = self._classes.get(key)
                if wanted is not None:
                    wanted.creating, wanted.failed_at = False, time.time()
            return
        ready = Ready(sandbox, start + config.ttl_s, _memory(sandbox))
        with self._cond:
            wanted = self._classes.get(key)
            if wanted is not None:
                wanted.creating = False
            if not self._closed and wanted is not None and len(wanted.ready) < self._targets().get(key, 0):
                wanted.ready.append(ready)
                return
        sandbox.close()   # the pool stopped, or the class went or has its share, meanwhile

    # -- stopping -------------------------------------------------------------------------------------------------
    def close(self, wait: bool = True) -> None:
        """Remove every ready sandbox; a creation under way is waited for (with `wait`), then removed. Idempotent."""
        with self._cond:
            self._closed = True
            closing = [r.sandbox for w in self._classes.values() for r in w.ready] + self._to_close
            for wanted in self._classes.values():
                wanted.ready = []
            self._to_close = []
            self._cond.notify_all()
        for sandbox in closing:
            sandbox.close()
        if wait and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(STOP_WAIT_S)


def _hand_over(sandbox: DockerSandbox, config: SandboxConfig) -> bool:
    """The ready sandbox becomes the job's: it still runs the image its tag names, and it takes the job's name (see
    the module's docstring) and config. False: it cannot serve (the caller removes it)."""
    box = sandbox.container
    try:
        state = box.client.api.inspect_container(box.id)
        if not state.get("State", {}).get("Running") or state.get("Image") != box.image_id:
            return False
        if str(box.client.api.inspect_image(config.image).get("Id")) != box.image_id:
            return False   # the tag moved since: the job gets the image it names now
        box.client.api.rename(box.id, taken_name(config.job_id, config.attempt))
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        log.debug("warm pool: a ready sandbox cannot be given: %s", exc)
        return False
    box.config = config   # (a git clone's container, for one, is labelled from it)
    return True


def _memory(sandbox: DockerSandbox) -> int | None:
    """The memory the container's cgroup uses (v1's memory controller, else v2's), read once: a ready sandbox's
    hardly changes. None where the host does not show it."""
    pid = sandbox.container.init_pid()
    try:
        where = None if pid is None else cgroup_dir(pid, "memory")
        if where is None:
            return None
        for name in ("memory.usage_in_bytes", "memory.current"):   # (v1, v2)
            if os.path.exists(os.path.join(where, name)):
                return int(read_small(os.path.join(where, name)))
    except (OSError, ValueError):
        pass
    return None


class PooledProvider(DockerProvider):
    """pid.sandbox_lifecycle.SandboxProvider over a warm pool, for one run of one job: its own sandbox is a ready
    one of its class when there is one, else a new one made as without a pool (DockerProvider, whose clear_job it
    keeps). Any later sandbox of the run (its --check's, made while the job's own holds the name pid-job-<id>-a<n>)
    is always made new, and is no class of the pool's. A packed workspace given to a taken sandbox is not unpacked
    here: the job's import_tar unpacks it (pid.jobs.snapshot.import_into)."""

    def __init__(self, pool: WarmPool, client: docker.DockerClient | None = None) -> None:
        super().__init__(client)
        self.pool = pool
        self._jobs_own_made = False

    def create(self, config: SandboxConfig, workspace: IO[bytes] | None = None) -> DockerSandbox:
        with self.pool.job_creating():   # (from before `served`: the refill it wakes waits for this job's own)
            if not self._jobs_own_made:
                self._jobs_own_made = True
                self.pool.served(config)
                taken = self.pool.take(config)
                if taken is not None:
                    return taken
            return super().create(config, workspace)


_active: list[WarmPool] = []   # this worker process's pool, when it has one (`pid worker --pool N`)


def start(sizes: PoolSizes) -> WarmPool:
    pool = WarmPool(sizes).start()
    _active.append(pool)
    return pool


def stop(wait: bool = True) -> None:
    """The worker stops: its pool's ready sandboxes go (`wait`: also the one being made, once it is)."""
    while _active:
        _active.pop().close(wait)


def provider() -> PooledProvider | None:
    """The provider one run of a job of this worker creates its sandboxes through (a new one for each run), or None
    (no pool: the runner's default)."""
    return PooledProvider(_active[0]) if _active else None


def status() -> list[dict[str, Any]] | None:
    return _active[0].status() if _active else None
