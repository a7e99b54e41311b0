"""The Celery app. Embedded by default (kombu's filesystem transport and a file result store under PID_HOME: no
server to install); PID_BROKER_URL / PID_RESULT_BACKEND switch to Redis or RabbitMQ for several machines.

Celery only dispatches. Whether a job runs, and only once, is decided by the job store (worker/store.py).
"""
from __future__ import annotations

import os

from celery import Celery

from pid.config import pid_home
from worker.clients import check_clients

QUEUE = "pid"


def embedded_broker() -> bool:
    """True when jobs run on this machine's filesystem queue (no PID_BROKER_URL)."""
    return (os.environ.get("PID_BROKER_URL") or "filesystem://").startswith("filesystem://")


def broker_settings(home: str) -> tuple[str, dict[str, object]]:
    url = os.environ.get("PID_BROKER_URL") or "filesystem://"
    if not embedded_broker():
        # A long agent job must not be redelivered while it runs; the job store's lease guards against it anyway.
        return url, {"visibility_timeout": 7 * 24 * 3600}
    queue_dir = os.path.join(home, "broker", "queue")
    processed = os.path.join(home, "broker", "processed")
    control = os.path.join(home, "broker", "control")
    for folder in (queue_dir, processed, control):
        os.makedirs(folder, mode=0o700, exist_ok=True)
    return url, {"data_folder_in": queue_dir, "data_folder_out": queue_dir, "processed_folder": processed,
                 "store_processed": False, "control_folder": control}


def make_app() -> Celery:
    home = pid_home()
    os.makedirs(home, mode=0o700, exist_ok=True)
    broker, transport_options = broker_settings(home)
    results = os.environ.get("PID_RESULT_BACKEND")
    check_clients({"PID_BROKER_URL": broker, **({"PID_RESULT_BACKEND": results} if results else {})})
    if not results:
        os.makedirs(os.path.join(home, "results"), mode=0o700, exist_ok=True)
        results = "file://" + os.path.join(home, "results")
    app = Celery("pid", broker=broker, backend=results, include=["worker.tasks"])
    app.conf.update(
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        task_default_queue=QUEUE,
        task_serializer="json", result_serializer="json", accept_content=["json"],
        task_acks_late=True,                # a worker that dies mid-job leaves the message to be redelivered...
        task_reject_on_worker_lost=True,    # ...and the job store's lease makes that redelivery safe
        task_track_started=True,
        worker_prefetch_multiplier=1,       # long jobs: never hoard messages another worker could run
        worker_max_tasks_per_child=1,       # a fresh process per job: no state leaks between jobs
        worker_pool="prefork",
        worker_hijack_root_logger=False,
        result_expires=7 * 24 * 3600,
    )
    return app


app = make_app()
