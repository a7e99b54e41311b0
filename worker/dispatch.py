"""Publishing a job's message: what `submit`, a hand-back and the reconciler do. Light on purpose: a client imports
this, the Celery app and the store, never the runner (the agent, its providers, the sandbox), so `pid submit` starts
in a fraction of the time.
"""
from __future__ import annotations

from worker.app import QUEUE, app
from worker.store import Store, default_store

TASK = "pid.run_job"   # worker/tasks.py run_job_task


def dispatch(job_id: str, store: Store | None = None, previous: float | None = None,
             reconcile: bool = False) -> bool:
    """Publish the job's message, recording it in the store first (the reconciler reads that record). With
    reconcile, only if no other worker re-dispatched it since `previous`: returns False then. A failed publish
    is recorded and raised. The message is the job's id and nothing else (no key: that stays in the store)."""
    store = store or default_store()
    record = store.get(job_id)
    queue = record.spec.queue if record is not None else QUEUE
    if not store.mark_dispatched(job_id, previous, only_if=reconcile):
        return False
    try:
        app.send_task(TASK, args=[job_id], task_id=job_id, queue=queue)
    except Exception as exc:
        store.mark_undispatched(job_id, f"{type(exc).__name__}: {exc}")
        raise
    store.mark_published(job_id)
    return True
