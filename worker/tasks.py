"""The Celery task and the worker's housekeeping. The task claims the job in the store and runs it beside a
ControlRelay (worker/control.py: lease, cancel/pause/steer/follow-up, progress), records the ending, and prints
one line when a job starts and one when it ends."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import warnings
from typing import Any

from celery import signals

from pid.config import EnvDefaults
from pid.endings import status_of
from worker.app import QUEUE, app
from worker.control import LEASE_S, ControlRelay, new_owner, record_end, with_earlier_attempts
from worker.runner import run_job
from worker.store import JobRecord, default_store
from worker.sweep import sweep

log = logging.getLogger("pid.worker")
jobs_log = logging.getLogger("pid.jobs")   # the worker's own lines: one when a job starts, one when it ends

SWEEP_EVERY_S = float(os.environ.get("PID_SWEEP_S", "30"))


@app.task(name="pid.run_job", acks_late=True)
def run_job_task(job_id: str, api_key: str | None = None) -> dict[str, Any]:
    store = default_store()
    owner = new_owner()
    if not store.claim(job_id, owner, LEASE_S):
        record = store.get(job_id)
        log.info("job %s not claimed (status %s): duplicate or cancelled delivery", job_id,
                 record.status if record else "unknown")
        return {"id": job_id, "skipped": True}
    record = store.get(job_id)
    assert record is not None
    jobs_log.info("job %s started%s: %s", job_id, f" (attempt {record.attempts})" if record.attempts > 1 else "",
                  _short(record.spec.task))
    relay = ControlRelay(store, job_id, owner)
    relay.start()
    result: dict[str, Any] = {"id": job_id, "exit_reason": "error"}
    try:
        result = run_job(record.spec, api_key=api_key or EnvDefaults.read().api_key, sink=relay.on_event,
                         on_agent=relay.attach, cancel=relay.cancel, still_owner=relay.still_owner,
                         amend_result=lambda r: with_earlier_attempts(r, record.earlier))
    except BaseException as exc:   # never a silent failure: the record says what stopped the job
        result["error"] = f"the job was stopped by {type(exc).__name__}: {exc}".strip().rstrip(":")[:500]
        raise
    finally:
        relay.stop()
        record_end(store, job_id, owner, result)
        jobs_log.info("%s", end_line(job_id, status_of(result["exit_reason"]), result.get("exit_reason"),
                                     result.get("duration_s"), (result.get("usage") or {}).get("cost")))
    return result


def end_line(job_id: str, status: str | None, exit_reason: str | None, duration_s: float | None,
             cost: float | None) -> str:
    line = f"job {job_id} {status} ({exit_reason})"
    if duration_s is not None:
        line += f" in {duration_s:.1f}s"
    if cost:
        line += f" · ${cost:.4f}"
    return line


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def dispatch(job_id: str, api_key: str | None = None) -> None:
    run_job_task.apply_async(args=[job_id], kwargs={"api_key": api_key} if api_key else {}, task_id=job_id)


def configure_job_lines() -> None:
    """pid's own lines reach the worker's stderr whatever --loglevel quiets (Celery's, httpx's); the warnings that
    say nothing to a pid user go (root is how pid's worker runs: the containers are the isolation)."""
    handler = logging.StreamHandler(sys.__stderr__)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"))
    jobs_log.addHandler(handler)
    jobs_log.setLevel(logging.INFO)
    jobs_log.propagate = False
    warnings.filterwarnings("ignore", message="You're running the worker with superuser privileges")
    logging.getLogger("kombu.connection").addFilter(
        lambda record: not record.getMessage().startswith("No hostname was supplied"))


def _log_swept(record: JobRecord) -> None:
    jobs_log.info("%s", end_line(record.id, record.status, record.exit_reason, record.duration_s,
                                 record.total_usage.get("cost")) + (f": {record.error}" if record.error else ""))


def _finish_running_jobs_on_ctrl_c(consumer: Any) -> None:
    """The first Ctrl-C takes no new job and lets the running ones end, then stops the worker. (Celery's own warm
    shutdown kills a running job's process when each job has a process of its own.) The second Ctrl-C is Celery's:
    stop now; the jobs it stops keep their record, and the next worker runs them again once their lease lapses."""
    from celery.worker import state

    try:
        celery_handler = signal.getsignal(signal.SIGINT)
    except ValueError:
        return

    def on_sigint(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, celery_handler)
        running = len(state.reserved_requests)
        if not running or not callable(celery_handler):
            if callable(celery_handler):
                celery_handler(signum, frame)
            return
        jobs_log.info("stopping: no new jobs; waiting for %d running job(s) to end (Ctrl-C again: stop now; "
                      "they run again on the next worker)", running)
        try:
            consumer.cancel_task_queue(QUEUE)
        except Exception:
            log.exception("no longer taking jobs")

        def stop_when_idle() -> None:
            while state.reserved_requests:
                time.sleep(0.5)
            if signal.getsignal(signal.SIGINT) is celery_handler:
                os.kill(os.getpid(), signal.SIGINT)   # Celery's shutdown, now that no job is running

        threading.Thread(target=stop_when_idle, name="pid-stop-when-idle", daemon=True).start()

    try:
        signal.signal(signal.SIGINT, on_sigint)
    except ValueError:   # not the main thread: Celery's handling stays
        pass


@signals.worker_ready.connect
def _start_housekeeping(sender: Any = None, **_: Any) -> None:
    """In the worker's main process: say it is ready; reap this installation's expired containers and orphaned
    disks, then sweep lost jobs; at start and periodically."""
    concurrency = getattr(getattr(sender, "controller", None), "concurrency", None)
    _finish_running_jobs_on_ctrl_c(sender)
    jobs_log.info("pid worker ready%s: waiting for jobs (Ctrl-C: finish the running jobs, then stop; "
                  "twice: stop now)", f" ({concurrency} at once)" if concurrency else "")

    def loop() -> None:
        store = default_store()
        while True:
            try:
                from pid.config import pid_home
                from sandbox.reaper import reap_installation
                reap_installation(pid_home())
            except Exception:
                log.exception("reaping expired containers and disks")
            try:
                sweep(store, on_end=_log_swept)
            except Exception:
                log.exception("sweeping lost jobs")
            time.sleep(SWEEP_EVERY_S)

    threading.Thread(target=loop, name="pid-housekeeping", daemon=True).start()
