"""A job's message on a Redis broker, pushed by pid itself: the message Celery's `app.send_task(TASK, args=[job_id],
task_id=job_id, queue=queue)` puts on the queue's list (task protocol 2, in kombu's Redis envelope), without Celery
or kombu in the process.

Why: `pid submit` is a short process whose start-up lies on the path from submit to the job's first model request,
and importing Celery and kombu and opening their connection cost it ~0.2 s. With a Redis broker the client already
holds a Redis connection (the job store's), and a message there is one LPUSH onto the list the workers BRPOP.
The workers consume with Celery as before; tests/test_publish.py checks this message field by field against the one
Celery itself sends, and the cluster tests run jobs published this way.

What differs from send_task, none of which a worker reads for pid's task: `reply_to` and `delivery_tag` are fresh
uuids (as kombu's are), `origin` names this process, and nothing is declared first (on Redis a queue is its list: a
message pushed before any worker consumed the queue waits there).
"""
from __future__ import annotations

import base64
import json
import os
import socket
import uuid
from typing import Any

TASK = "pid.run_job"   # worker/tasks.py run_job_task


def message(job_id: str, queue: str) -> bytes:
    """The list entry: kombu's envelope (its virtual transport's prepare_message and basic_publish) around Celery's
    task message (as_task_v2 with send_task's defaults: no eta, expiry, limits or parent)."""
    args = [job_id]
    headers: dict[str, Any] = {
        "lang": "py", "task": TASK, "id": job_id, "shadow": None, "eta": None, "expires": None,
        "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
        "root_id": job_id, "parent_id": None, "argsrepr": repr(args), "kwargsrepr": "{}",
        "origin": f"gen{os.getpid()}@{socket.gethostname()}", "ignore_result": None,
        "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
    }
    body = json.dumps([args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    envelope = {
        "body": base64.b64encode(body.encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "correlation_id": job_id, "reply_to": str(uuid.uuid4()), "delivery_mode": 2,
            # the anonymous exchange, the queue's name as routing key: how Celery sends to a named queue on Redis,
            # and what a worker that hands the message back (restores it) looks the queue up by
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0, "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
        },
    }
    return json.dumps(envelope).encode()


def push(client: Any, job_id: str, queue: str, front: bool = False) -> None:
    """LPUSH the job's message onto `queue`'s list (priority 0's list is the queue's own name) with a redis-py
    client; its errors are raised (redis-py retries a dropped connection first). Workers BRPOP the list's other
    end: with `front`, RPUSH puts the message there, the next one taken."""
    (client.rpush if front else client.lpush)(queue, message(job_id, queue))
