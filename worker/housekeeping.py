"""What a worker does beside its jobs, in its own threads: say it is alive (a heartbeat in the store every BEAT_S, in
a thread of its own so that no slow step delays it), and every few seconds notice a job store that lost its data
(jobs/store_watch.py), put back in the queue the jobs whose process is gone (jobs/sweep.py), dispatch the queued
jobs that need a message (put back, handed back, or whose message was lost; those that ran before go to the front of
their queue), and now and then remove expired containers.

A worker is alive while it beats: one not heard from for ALIVE_WITHIN_S (a few beats) is presumed gone, and on its
own machine one whose process is gone is known gone at once. One that stops cleanly says so (its heartbeat is kept,
marked stopped, for `pid workers --all`).

Why a reconciler: the broker can lose a message (an exception before the claim after Celery acked it, a Redis that
restarts without persistence, a broker down when a job was put back), and nothing else would ever dispatch that job.
A queued job is dispatched again when some live worker has had a free slot for RECONCILE_S while the job's message
should have been in the queue that whole time: the message is lost, or stuck. Whatever the workers are doing, a job
waits at most REDISPATCH_AFTER_S for its message to be taken before it is dispatched again. The claim makes a
duplicate harmless.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Callable

from pid.config import pid_home
from pid.jobs import policy
from pid.jobs.identity import process_identity
from pid.jobs.spec import DEFAULT_QUEUE
from pid.jobs.store import JobRecord, Store
from pid.jobs.store_watch import StoreWatch
from pid.jobs.workers import ALIVE_WITHIN_S, BEAT_S, live_workers
from pid.jobs.outage import first_line, transient
from pid.worker import warm_pool
from pid import settings

log = logging.getLogger("pid.worker")

EVERY_S = settings.SWEEP_S.get()
RECONCILE_S = settings.RECONCILE_S.get()
REDISPATCH_AFTER_S = settings.REDISPATCH_AFTER_S.get()   # ...whatever the workers are doing
DISPATCH_GIVE_UP_S = settings.DISPATCH_GIVE_UP_S.get()
REAP_EVERY_S = 60.0
REAPING = "reaping expired containers and disks"   # the one step that asks the engine, not the store
PRUNE_EVERY_S = 3600.0   # ended jobs, their logs and artifacts, and unused blobs past PID_RETENTION leave the store
STOP_WAIT_S = 10.0                    # for each housekeeping thread when the worker stops
# A silence between two beats that a lease can lapse in is recorded as one (jobs/sweep.store_just_back); a beat merely
# late is not. (A lease of 30 s: 7 s; PID_LEASE_S=3: 3 s.)
SILENT_S = max(1.5 * BEAT_S, min(ALIVE_WITHIN_S, settings.LEASE_S.get() / 2))


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def reconcile(store: Store, on_end: Callable[[JobRecord], None] | None = None,
              dispatch: Callable[..., bool] | None = None) -> list[str]:
    """Dispatch the queued jobs that need a message (with `dispatch`, pid.jobs.dispatch.dispatch by default); end those
    that could not be dispatched for DISPATCH_GIVE_UP_S. Returns the ids dispatched."""
    if dispatch is None:
        from pid.jobs.dispatch import dispatch as publish
        dispatch = publish
    now = store.now()   # the clock the store's times are on
    idle_queues = {queue for w in live_workers(store)
                   if w.free_since is not None and w.free_since < now - RECONCILE_S for queue in w.queues}
    dispatched = []
    rooms: dict[str, int | None] = {}   # a batch's free slots (--max-running): its other jobs wait, undispatched
    for job in store.to_dispatch(stale_before=now - RECONCILE_S):
        if job.spec.batch and _slots(store, rooms, job.spec.batch) == 0:   # held back: waiting, not failing
            if job.undispatched_since is not None:   # (a clock started while it seemed to have a slot)
                from pid.jobs.batch_budget import PARKED
                store.mark_undispatched(job.id, PARKED, parked=True)
            continue
        idle = job.spec.queue in idle_queues   # a worker of the job's queue has been free: its message is lost
        if job.dispatched_at is not None and not idle and job.dispatched_at >= now - REDISPATCH_AFTER_S:
            continue
        if job.dispatched_at is not None:
            log.warning("job %s: dispatched %.0fs ago and not taken%s: dispatching it again (a duplicate is "
                        "harmless)", job.id, now - job.dispatched_at,
                        " while a worker was free: its message is lost" if idle else "")
        try:
            if dispatch(job.id, store=store, previous=job.dispatched_at, reconcile=True):
                dispatched.append(job.id)
                _take_slot(rooms, job.spec.batch)
        except Exception as exc:
            log.warning("dispatching queued jobs: %s", exc)
            _take_slot(rooms, job.spec.batch)   # the job that failed holds it: the batch's others stay held back
            _give_up(store, exc, now, rooms, on_end)
            break   # the broker is down: the next pass tries again
    return dispatched


def _give_up(store: Store, exc: Exception, now: float, rooms: dict[str, int | None],
             on_end: Callable[[JobRecord], None] | None) -> None:
    """A publish failed: the queued jobs that need one fail with it (their clocks start now, those of a pass cut
    short too), and those whose publishes have failed for DISPATCH_GIVE_UP_S end `dispatch_failed`. Not a job its
    batch holds back (--max-running: never tried), nor one a worker claimed meanwhile (finish_if_queued)."""
    from pid.jobs.results import log_job
    from pid.jobs.sweep import write_unrun_result
    for waiting in store.to_dispatch(stale_before=None):
        if waiting.spec.batch and _slots(store, rooms, waiting.spec.batch) == 0:
            continue
        if waiting.dispatch_error is None or waiting.undispatched_since is None:
            store.mark_undispatched(waiting.id, f"{type(exc).__name__}: {exc}")
            continue
        since = waiting.undispatched_since
        if now - since < DISPATCH_GIVE_UP_S:
            continue
        error = f"could not be dispatched for {now - since:.0f}s: {exc}"[:500]
        if store.finish_if_queued(waiting.id, "dispatch_failed", error=error):
            log_job(store, waiting.id, "failed", f"dispatch_failed: {error}", exit_reason="dispatch_failed")
            write_unrun_result(waiting.spec, "dispatch_failed", error, waiting, store=store)
            if on_end:
                on_end(store.get(waiting.id) or waiting)


def _slots(store: Store, rooms: dict[str, int | None], batch: str) -> int | None:
    """A batch's free slots (--max-running) in this pass, asked of the store once; None: it has no limit."""
    if batch not in rooms:
        from pid.jobs.batch_budget import room
        rooms[batch] = room(store, batch)
    return rooms[batch]


def _take_slot(rooms: dict[str, int | None], batch: str | None) -> None:
    """A job of `batch` took one of its free slots in this pass (its publish was tried)."""
    left = rooms.get(batch) if batch else None
    if batch and left:
        rooms[batch] = left - 1


class Housekeeping:
    """The worker's housekeeping thread. `running` and `taking_jobs` tell its heartbeat how busy it is."""

    def __init__(self, node: str, concurrency: int, running: Callable[[], int], taking_jobs: Callable[[], bool],
                 on_end: Callable[[JobRecord], None] | None = None, queues: list[str] | None = None) -> None:
        self.node, self.concurrency, self.queues = node, concurrency, queues or [DEFAULT_QUEUE]
        self.running, self.taking_jobs, self.on_end = running, taking_jobs, on_end
        self._stop = threading.Event()
        self._watch: StoreWatch | None = None
        self._next_reap = 0.0
        self._next_prune = time.monotonic() + REAP_EVERY_S   # not in the worker's first minute
        self._thread = threading.Thread(target=self._loop, name="pid-housekeeping", daemon=True)
        self._beating = threading.Thread(target=self._beat_loop, name="pid-heartbeat", daemon=True)

    def start(self) -> None:
        self._beating.start()
        self._thread.start()

    def stop(self) -> None:
        """Stop both threads; the heartbeat thread's last write marks the worker stopped."""
        self._stop.set()
        self._beating.join(timeout=STOP_WAIT_S)
        self._thread.join(timeout=STOP_WAIT_S)

    def _beat_loop(self) -> None:
        """A beat every BEAT_S; on stop, the stop is recorded by this thread, after its last beat: a beat still on its
        way when the worker stops (a slow store) can never come after the stop and make the worker look alive."""
        from pid.jobs.store import default_store
        store = default_store()
        identity = process_identity(os.getpid())
        failing: str | None = None   # said once while the store keeps refusing beats, not every BEAT_S
        while not self._stop.is_set():
            try:
                store.beat(self.node, socket.gethostname(), os.getpid(), boot_id(), self.concurrency,
                           self.running(), self.taking_jobs(), self.queues, policy.active().to_dict(), identity,
                           alarm=self._watch.alarm if self._watch else None, pool=warm_pool.status(),
                           silent_s=SILENT_S)
                if failing is not None:
                    log.warning("this worker's heartbeat is recorded again")
                    failing = None
            except Exception as exc:
                if str(exc) != failing:
                    log.warning("recording this worker's heartbeat: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))
                failing = str(exc)
            self._stop.wait(BEAT_S)
        try:
            store.worker_stopped(self.node)
        except Exception:
            log.debug("recording this worker's stop", exc_info=True)

    def _loop(self) -> None:
        from pid.jobs.store import default_store
        store = default_store()
        while True:
            self.once(store)
            if self._stop.wait(EVERY_S):
                return

    def once(self, store: Store) -> None:
        from pid.jobs.sweep import sweep
        if self._watch is None or self._watch.store is not store:
            self._watch = StoreWatch(store)
        watch = self._watch
        steps: list[tuple[str, Callable[[], object]]] = [
            ("watching the job store", watch.check),   # its alarm goes into the heartbeat
            ("sweeping lost jobs", lambda: sweep(store, on_end=self.on_end)),
            ("dispatching queued jobs", lambda: reconcile(store, on_end=self.on_end)),
        ]
        if time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + PRUNE_EVERY_S
            steps.append(("removing what the retention period has passed", store.prune))
        if time.monotonic() >= self._next_reap:
            self._next_reap = time.monotonic() + REAP_EVERY_S
            steps.insert(0, ("forgetting workers silent for long", store.forget_silent_workers))
            steps.insert(0, (REAPING, self._reap))
        for what, step in steps:
            if self._stop.is_set():
                return
            try:
                step()
            except Exception as exc:
                if what == REAPING or not transient(exc):   # (reaping asks the engine, not the store)
                    log.exception("%s", what)
                    continue
                # One line, not a traceback per step: the store restarting is no bug, and the next pass tries again.
                log.warning("%s: the job store is unreachable (%s): tried again in the next pass", what,
                            first_line(exc))
                return

    @staticmethod
    def _reap() -> None:
        from pid.sandbox.reaper import reap_installation
        reap_installation(pid_home())
