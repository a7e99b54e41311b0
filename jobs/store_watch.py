"""A worker's watch on a Redis job store: one that forgets everything when it restarts is refused at start, and one
that restarted empty all the same (persistence turned off later, its files lost, a flush) is said out loud.

Why: the store is the source of truth for every job (jobs/store.py). The broker's lost messages are sent again
from it (worker/housekeeping.py reconcile); nothing can send again what the store itself lost: a Redis without
persistence that restarts takes every queued and running job with it, silently, and nothing runs afterwards.
A SQLite store is a file: there is nothing to watch.
"""
from __future__ import annotations

import logging
import time

from pid.jobs.store import Store, StoreBase

log = logging.getLogger("pid.jobs")


def volatile(store: StoreBase) -> str | None:
    """Why `store` would lose every job on a restart (one line), or None: it persists, or it is not a Redis, or it
    will not say (then a warning is logged)."""
    from pid.jobs.redis_store import RedisStore
    if not isinstance(store, RedisStore):
        return None
    kept = store.persistence()
    if kept is None:
        log.warning("the job store %s does not say whether it persists (CONFIG refused): make sure it keeps an "
                    "append-only file or snapshots, or a restart loses every job", store.path)
        return None
    if kept:
        return None
    return (f"the job store {store.path} keeps neither an append-only file (appendonly no) nor snapshots (save \"\"): "
            "a restart of it loses every job. Turn one on (redis-server --appendonly yes), or start the worker "
            "with --allow-volatile-store")


class StoreWatch:
    """Notices, on each housekeeping pass, that the Redis store lost pid's data since the last one. Its `alarm`
    stays set for the life of the worker, in its heartbeat (`pid workers`)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.alarm: str | None = None
        self._seen: tuple[str, str] | None = None   # (run id, pid's mark) at the last pass

    def check(self) -> str | None:
        from pid.jobs.redis_store import RedisStore
        if not isinstance(self.store, RedisStore):
            return None
        run_id, mark = self.store.incarnation()
        seen, self._seen = self._seen, (run_id, mark)
        if seen is None or seen == (run_id, mark):
            return self.alarm
        if mark == seen[1]:
            log.warning("the job store %s restarted (Redis run id %s, was %s) with its data", self.store.path,
                        run_id[:12], seen[0][:12])
            return self.alarm
        how = "restarted EMPTY (its run id changed)" if run_id != seen[0] else "was EMPTIED (a flush?)"
        self.alarm = (f"the job store {self.store.path} {how} at {time.strftime('%Y-%m-%d %H:%M:%S')}: every job "
                      "recorded before is gone (queued and running ones will never run or finish; resubmit them); "
                      "give Redis persistence (appendonly yes)")
        log.error("!!! %s", self.alarm)
        return self.alarm
