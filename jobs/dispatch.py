"""Publishing a job's message: what `submit`, a hand-back and the reconciler do. Light on purpose: a client imports
this and the store, never the runner (the agent, its providers, the sandbox) nor Celery (jobs/publish.py sends the
message Celery would), so `pid submit` starts in a fraction of the time.
"""
from __future__ import annotations

import os
from typing import Any

from pid.jobs.brokers import embedded_broker, redis_broker
from pid.jobs.spec import DEFAULT_QUEUE
from pid.jobs.publish import message, push, send
from pid.jobs.store import Store, StoreBase, default_store
from pid import settings

_redis_clients: dict[tuple[int, str], Any] = {}   # a broker that is not the store's Redis: one client per process


def dispatch(job_id: str, store: Store | None = None, previous: float | None = None,
             reconcile: bool = False) -> bool:
    """Publish the job's message, recording it in the store first (the reconciler reads that record). With
    reconcile, only if no other worker re-dispatched it since `previous`: returns False then. A failed publish
    is recorded and raised. The message is the job's id and nothing else (no key: that stays in the store).
    A job that ran before (put back after its worker was lost, or handed back) goes to the front of its queue:
    it is taken before the jobs that never started."""
    store = store or default_store()
    record = store.get(job_id)
    queue = record.spec.queue if record is not None else DEFAULT_QUEUE
    if not store.mark_dispatched(job_id, previous, only_if=reconcile):
        return False
    _, error = publish(store, [(job_id, queue)], front=record is not None and record.attempts > 0)
    if error is not None:
        store.mark_undispatched(job_id, f"{type(error).__name__}: {error}")
        raise error
    store.mark_published(job_id)
    return True


def publish(store: StoreBase, jobs: list[tuple[str, str]], front: bool = False) -> tuple[int, Exception | None]:
    """Send the messages of (job id, queue) pairs, in order, over one connection: how many went before the broker
    refused one, and why (None: all went). The store's records are the caller's to keep. `front`: ahead of the
    messages already queued, on Redis and the embedded broker (RabbitMQ has no front: they wait their turn)."""
    if not jobs:
        return 0, None
    broker = redis_broker()
    if broker is not None:   # pushed in one round trip: no Celery, no kombu in this process (jobs/publish.py)
        try:
            pipe = _redis_client(store, broker).pipeline(transaction=False)
            for job_id, queue in jobs:
                push(pipe, job_id, queue, front)
            pipe.execute()
        except Exception as exc:
            return 0, exc
        return len(jobs), None
    from pid.config import pid_home
    if embedded_broker():   # put in the queue's folder as its transport would: no kombu in this process either
        from pid.jobs.brokers import embedded_queue
        from pid.jobs.queue_files import FRONT_PRIORITY, put
        folder, sent = embedded_queue(pid_home()), 0
        try:
            for job_id, queue in jobs:
                # (the transport reads this priority as "the front": jobs/transport.py)
                put(folder, queue, message(job_id, queue, FRONT_PRIORITY if front else 0), front)
                sent += 1
        except (OSError, ValueError) as exc:
            return sent, exc
        return sent, None
    from pid.jobs.brokers import broker_settings
    from pid.jobs.clients import check_clients
    url, options = broker_settings(pid_home())
    check_clients({settings.BROKER_URL.name: url})
    return send(url, options, jobs)   # (RabbitMQ has no front: they wait their turn)


def _redis_client(store: StoreBase, url: str) -> Any:
    """A client of the broker's Redis: the store's own when the store is that Redis (its connection is open)."""
    from pid.jobs.redis_store import RedisStore
    if isinstance(store, RedisStore) and store.url == url:
        return store.client()
    key = (os.getpid(), url)
    if key not in _redis_clients:
        import redis
        _redis_clients[key] = redis.Redis.from_url(url, socket_connect_timeout=10, socket_timeout=60)
    return _redis_clients[key]
