"""A job's message, sent by pid itself in Celery's task protocol 2: what Celery's `app.send_task(TASK, args=[job_id],
task_id=job_id, queue=queue)` sends, without Celery in the process. On a Redis broker it is pushed as kombu's Redis
envelope with the client's own connection, and on the embedded queue the same envelope is put in the queue's folder
as its transport would (jobs/queue_files.py): no kombu either. On RabbitMQ kombu publishes it, as Celery would.

Why: `pid submit` is a short process whose start-up lies on the path from submit to the job's first model request,
and importing Celery cost it ~0.1 s (and kombu and its connection another ~0.1 s, which Redis and the embedded queue
spare).
The workers consume with Celery as before; tests/test_publish.py checks both messages field by field against the
ones Celery itself sends, and the cluster tests run jobs published this way.

What differs from send_task, none of which a worker reads for pid's task: `reply_to` and `delivery_tag` are fresh
uuids (as kombu's are), `origin` names this process, and on Redis and the embedded queue nothing is declared first
(there a queue is its list or its files: a message put before any worker consumed the queue waits there).
"""
from __future__ import annotations

import base64
import json
import os
import socket
import threading
import uuid
from typing import Any

TASK = "pid.run_job"   # worker/tasks.py run_job_task


# Celery's default publish retry (task_publish_retry_policy): a dropped connection is tried again 3 times
RETRY_POLICY = {"max_retries": 3, "interval_start": 0, "interval_max": 1, "interval_step": 0.2}


def task_message(job_id: str) -> tuple[dict[str, Any], list[Any]]:
    """Celery's task message, its headers and body (as_task_v2 with send_task's defaults: no eta, expiry, limits or
    parent)."""
    args = [job_id]
    headers: dict[str, Any] = {
        "lang": "py", "task": TASK, "id": job_id, "shadow": None, "eta": None, "expires": None,
        "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
        "root_id": job_id, "parent_id": None, "argsrepr": repr(args), "kwargsrepr": "{}",
        "origin": f"gen{os.getpid()}@{socket.gethostname()}", "ignore_result": None,
        "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
    }
    return headers, [args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]


def message(job_id: str, queue: str, priority: int = 0) -> bytes:
    """The Redis list entry and the embedded queue's file alike: kombu's envelope (its virtual transport's
    prepare_message and basic_publish) around the task message."""
    headers, body = task_message(job_id)
    envelope = {
        "body": base64.b64encode(json.dumps(body).encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "correlation_id": job_id, "reply_to": str(uuid.uuid4()), "delivery_mode": 2,
            # the anonymous exchange, the queue's name as routing key: how Celery sends to a named queue on Redis,
            # and what a worker that hands the message back (restores it) looks the queue up by
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": priority, "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
        },
    }
    return json.dumps(envelope).encode()


def push(client: Any, job_id: str, queue: str, front: bool = False) -> None:
    """LPUSH the job's message onto `queue`'s list (priority 0's list is the queue's own name) with a redis-py
    client; its errors are raised (redis-py retries a dropped connection first). Workers BRPOP the list's other
    end: with `front`, RPUSH puts the message there, the next one taken."""
    (client.rpush if front else client.lpush)(queue, message(job_id, queue))


def send(url: str, options: dict[str, Any], jobs: list[tuple[str, str]]) -> tuple[int, Exception | None]:
    """Publish the messages of (job id, queue) pairs with kombu, as Celery's send_task does: to the anonymous
    exchange with the queue's name as routing key, the queue (a direct exchange of its name) declared first. How many
    went before the broker refused one, and why (None: all went). The connection stays open for the process's next
    messages (a worker's hand-backs and re-dispatches, as Celery's producer pool kept it), one sender at a time; one
    that failed is dropped, and the next send connects anew."""
    from kombu import Connection, Exchange, Queue
    key = (os.getpid(), url)
    sent = 0
    with _connections_lock:
        connection = _connections.get(key)
        if connection is None:
            connection = _connections[key] = Connection(url, transport_options=options, connect_timeout=4)
        try:
            producer = connection.Producer(serializer="json")
            for job_id, queue in jobs:
                headers, body = task_message(job_id)
                producer.publish(body, exchange="", routing_key=queue, headers=headers, delivery_mode=2,
                                 declare=[Queue(queue, Exchange(queue, "direct"), routing_key=queue)],
                                 retry=True, retry_policy=RETRY_POLICY, correlation_id=job_id,
                                 reply_to=str(uuid.uuid4()))
                sent += 1
        except Exception as exc:
            del _connections[key]
            try:
                connection.release()
            except Exception:   # noqa: BLE001 - it failed already: its error is the one to report
                pass
            return sent, exc
    return sent, None


_connections: dict[tuple[int, str], Any] = {}   # kombu connections by (process, broker url)
_connections_lock = threading.Lock()            # (a kombu connection is not thread-safe)
