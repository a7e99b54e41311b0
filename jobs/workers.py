"""The workers of a job store, as their heartbeats show them (jobs/store.py Heartbeats): which are alive, which
stopped or are gone. The worker beats (worker/housekeeping.py); the client reads (`pid workers`, submit's check that
some live worker takes the job's queue and allows it)."""
from __future__ import annotations

import time
from typing import Any

from pid.jobs.identity import process_alive
from pid.jobs.spec import DEFAULT_QUEUE
from pid.jobs.store import ALIVE_WITHIN_S, BEAT_S, Heartbeats, WorkerBeat

__all__ = ["ALIVE_WITHIN_S", "BEAT_S", "QueuedNotice", "live_workers", "no_worker", "process_gone", "still_queued",
           "unserved_queues", "worker_state"]


def worker_state(beat: WorkerBeat, now: float) -> str:
    """alive, stopped (cleanly), lost (on this machine, its process is gone) or silent (not heard from lately)."""
    if beat.stopped_at is not None:
        return "stopped"
    if process_gone(beat):
        return "lost"
    return "alive" if now - beat.beat_at <= ALIVE_WITHIN_S else "silent"


def live_workers(store: Heartbeats) -> list[WorkerBeat]:
    """The workers alive now: heard from lately, not stopped, and not known gone."""
    return [w for w in store.workers(alive_within_s=ALIVE_WITHIN_S) if not process_gone(w)]


def process_gone(beat: WorkerBeat) -> bool:
    """The worker's process is known to be gone: it ran on this machine, in this boot and pid namespace (its
    identity says), and no process with its pid and start time is here. Elsewhere nothing is known (False)."""
    return beat.identity is not None and process_alive(beat.host, beat.pid, beat.identity) is False


def still_queued(store: Any, job_id: str, waited_s: float, again: bool = False) -> str | None:
    """What a wait says of a job still queued after `waited_s` seconds (`pid result --wait`, Job.wait), or (`again`)
    back in the queue: which live workers take its queue and how busy they are, or that none does and how to start
    one. None: it is not in the queue."""
    record = store.get(job_id)
    if record is None or record.status != "queued":
        return None
    queue = record.spec.queue
    workers = [w for w in live_workers(store) if queue in w.queues]
    waited = f"job {job_id} is back in the queue" if again else f"job {job_id} is still queued after {waited_s:g}s"
    if workers:
        running = sum(w.running for w in workers)
        return f"{waited}: {len(workers)} worker(s) are running {running} job(s); it waits for a free one"
    return f"{waited}: {no_worker(queue)}{_silent_ones(store, queue)}"


SILENT_SAID_S = 600   # a worker silent for longer than this is not named beside "no worker"


def _silent_ones(store: Any, queue: str) -> str:
    """The workers of `queue` heard from lately but not now (a store outage silences them all until they beat
    again, as does a frozen machine): named, so that nobody starts workers for an outage."""
    now = time.time()
    silent = [w for w in store.workers() if queue in w.queues and worker_state(w, now) == "silent"
              and now - w.beat_at <= SILENT_SAID_S]
    if not silent:
        return ""
    return (f"; {len(silent)} worker(s) that take it were last heard from {now - max(w.beat_at for w in silent):.0f}s "
            "ago (cut off from the job store, frozen, or gone)")


class QueuedNotice:
    """A wait's word on its job sitting in the queue: once it has waited `notice_s` there, and again should it go back
    to the queue after it ran (its worker died or stopped): call it as the wait goes on; a line to say, or None."""

    def __init__(self, store: Any, job_id: str, notice_s: float) -> None:
        self.store, self.job_id, self.notice_s = store, job_id, notice_s
        self._next = time.monotonic() + notice_s
        self._said = False   # of the job's present stay in the queue
        self._left = False   # it has been seen out of the queue since the wait began

    def __call__(self) -> str | None:
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.notice_s
        line = still_queued(self.store, self.job_id, self.notice_s, again=self._left)
        if line is None:
            self._said, self._left = False, True
            return None
        if self._said:
            return None
        self._said = True
        return line


def unserved_queues(store: Any, queues: set[str]) -> list[str]:
    """Those of `queues` that no live worker consumes, sorted."""
    served = {queue for w in live_workers(store) for queue in w.queues}
    return sorted(queues - served)


def no_worker(queue: str) -> str:
    start = "pid worker" + ("" if queue == DEFAULT_QUEUE else f" --queue {queue}")
    return f"no worker is consuming queue '{queue}' (start one with `{start}`)"
