"""The Celery app. Embedded by default (a filesystem queue under PID_HOME whose messages appear whole or not at all:
jobs/transport.py; no server to install); PID_BROKER_URL switches to Redis or RabbitMQ for several machines.

Celery only dispatches. Whether a job runs, and only once, is decided by the job store (jobs/store.py): so a
message is acknowledged as soon as a worker process takes it (no broker timeout can then redeliver a long job or
close a worker's channel), and Celery keeps no results (the store has them; nothing waits on a result backend).
"""
from __future__ import annotations

from celery import Celery

from pid.config import pid_home
from pid.jobs.brokers import broker_settings
from pid.jobs.clients import check_clients
from pid.jobs.spec import DEFAULT_QUEUE
from pid.output_dirs import make_marked
from pid import settings

QUEUE = DEFAULT_QUEUE   # the default queue (a job names its own: JobSpec.queue)


def make_app() -> Celery:
    home = pid_home()
    make_marked(home, mode=0o700)
    broker, transport_options = broker_settings(home)
    check_clients({settings.BROKER_URL.name: broker})
    # What a worker loads as it starts (before it builds its consumer): the job task, and the worker process's own
    # hooks (how it takes jobs, how it stops, its housekeeping), which use the task's module in turn.
    app = Celery("pid", broker=broker, include=["pid.worker.tasks", "pid.worker.main_process"])
    app.conf.update(
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        task_default_queue=QUEUE,
        task_serializer="json", result_serializer="json", accept_content=["json"],
        task_acks_late=False,               # acked when a worker takes it: the store's claim follows at once
        task_ignore_result=True,
        worker_prefetch_multiplier=1,       # long jobs: never hoard messages another worker could run
        worker_disable_prefetch=broker.startswith(("redis", "rediss", "sentinel")),   # ...not even one (Redis only)
        # Only late-acked tasks are cancelled on a lost connection (pid's are acked on take: none is); set, it spares
        # the worker's log Celery's warning about this setting on every reconnection.
        worker_cancel_long_running_tasks_on_connection_loss=True,
        # Jobs are threads of one worker process. A job mostly waits (on the model, on its container), so threads
        # cost nothing while they wait: one worker runs dozens of jobs on two cores. A process per job costs ~40 MB
        # and ~0.4 s of CPU to start, and forking beside the worker's own threads can deadlock the child. What
        # isolates a job from another is its container; in the worker, a job is its thread, its store connection
        # and its own clients (model, engine), and nothing module-level is written per job.
        worker_pool="threads",
        worker_hijack_root_logger=False,
        result_expires=7 * 24 * 3600,
    )
    return app


app = make_app()
