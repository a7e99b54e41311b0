"""The Celery task and the worker's signals. The task claims the job in the store and runs it beside a ControlRelay
(worker/control.py: lease, cancel/pause/steer/follow-up, progress), records the ending, and prints one line when a
job starts and one when it ends. A worker told to stop (SIGTERM, SIGHUP, a second Ctrl-C) hands its running jobs
back to the queue: they run again on the next worker, never `failed` for it."""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
import warnings
from typing import Any, Callable

from celery import signals

from pid.config import EnvDefaults
from pid.endings import status_of
from worker.app import QUEUE, app
from worker.control import LEASE_S, ControlRelay, new_owner, record_end, with_earlier_attempts
from worker.runner import run_job
from worker.store import JobRecord, JobStore, default_store

log = logging.getLogger("pid.worker")
jobs_log = logging.getLogger("pid.jobs")   # the worker's own lines: one when a job starts, one when it ends

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class StopSignals:
    """In a job's process, while the job runs: SIGTERM, SIGHUP or a second SIGINT (the first one is the worker's:
    it lets running jobs end) ask for the job to be handed back. The handler only sets a flag: the relay's thread
    stops the agent."""

    def __init__(self, relay: ControlRelay | None = None) -> None:
        self.relay = relay
        self.requested: str | None = None   # the signal's name, once one asked
        self._interrupts = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> "StopSignals":
        for sig in STOP_SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:   # not the main thread (a test calling the task directly)
                pass
        return self

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts < 2:
                return
        if self.requested is None:
            self.requested = signal.Signals(signum).name
            if self.relay is not None:
                self.relay.request_stop()


def start_only_what_can_start(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Callable[..., Any]:
    """The job task's Celery strategy. On RabbitMQ the broker pushes messages, and one a worker holds without a free
    process to start it stays unacknowledged until one is free: past the broker's consumer_timeout, the broker
    closes the channel and the worker stops. So there the worker consumes only while it has a free process: it stops
    consuming when its processes are all taken (a timer in the worker starts it again when one is free), and gives
    back, at once, a message that arrives anyway (sent before the pause, or after a reconnection)."""
    from celery.worker.strategy import default
    handle = default(task, app, consumer, **kwargs)
    if consumer.connection.transport.driver_type != "amqp":
        return handle   # the other transports take a message only when asked (see _take_only_what_can_start)
    from celery.worker import state
    concurrency = getattr(consumer.controller, "concurrency", None) or consumer.pool.num_processes

    def on_message(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **more: Any) -> Any:
        if len(state.reserved_requests) >= concurrency:
            log.info("job %s: no free process; the message goes back to the broker", message.headers.get("id"))
            message.reject_log_error(log, consumer.connection_errors, requeue=True)
            _pause_consuming(consumer)
            return None
        handled = handle(message, body, ack, reject, callbacks, **more)
        if len(state.reserved_requests) >= concurrency:
            _pause_consuming(consumer)
        return handled
    return on_message


def _pause_consuming(consumer: Any) -> None:
    if consumer.task_consumer.consuming_from(QUEUE):
        consumer.task_consumer.cancel_by_queue(QUEUE)   # still selected: a reconnection consumes again


def _resume_consuming(consumer: Any, concurrency: int, taking_jobs: Callable[[], bool]) -> None:
    """In the worker's event loop: consume again once a process is free (unless the worker is stopping)."""
    from celery.worker import state
    task_consumer = consumer.task_consumer
    if (task_consumer is None or not taking_jobs() or len(state.reserved_requests) >= concurrency
            or task_consumer.consuming_from(QUEUE)):
        return
    try:
        consumer.add_task_queue(QUEUE)
    except Exception as exc:   # the connection is down: Celery reconnects, and consumes again itself
        log.debug("consuming again: %s", exc)


@app.task(name="pid.run_job", Strategy="worker.tasks:start_only_what_can_start")
def run_job_task(job_id: str, api_key: str | None = None) -> None:
    stop = StopSignals().install()
    try:
        _run_claimed(job_id, api_key, stop)
    finally:
        stop.restore()


def _run_claimed(job_id: str, api_key: str | None, stop: StopSignals) -> None:
    store = default_store()
    owner = new_owner()
    if not store.claim(job_id, owner, LEASE_S):
        record = store.get(job_id)
        if record is None:
            log.error("job %s: a message for a job that is not in the job store (%s): dropped", job_id, store.path)
        else:
            log.info("job %s not claimed (status %s): duplicate or cancelled delivery", job_id, record.status)
        return
    record = store.get(job_id)
    assert record is not None
    jobs_log.info("job %s started%s: %s", job_id, f" (attempt {record.attempts})" if record.attempts > 1 else "",
                  _short(record.spec.task))
    relay = ControlRelay(store, job_id, owner)
    stop.relay = relay
    if stop.requested:
        relay.request_stop()
    relay.start()
    result: dict[str, Any] = {"id": job_id, "exit_reason": "error"}
    kept: list[bool] = []   # the runner's last word on whether this process still owns the job (then it wrote)

    def still_owner() -> bool:
        kept.append(stop.requested is None and relay.still_owner())
        return kept[-1]

    try:
        result = run_job(record.spec, api_key=api_key or EnvDefaults.read().api_key, sink=relay.on_event,
                         on_agent=relay.attach, cancel=relay.cancel, still_owner=still_owner,
                         amend_result=lambda r: with_earlier_attempts(r, record.earlier))
    except BaseException as exc:   # never a silent failure: the record says what stopped the job
        result["error"] = f"the job was stopped by {type(exc).__name__}: {exc}".strip().rstrip(":")[:500]
        raise
    finally:
        relay.stop()
        if stop.requested and not (kept and kept[-1]):
            hand_back(store, job_id, owner, relay, stop.requested, api_key)
        else:
            record_end(store, job_id, owner, result)
            jobs_log.info("%s", end_line(job_id, status_of(result["exit_reason"]), result.get("exit_reason"),
                                         result.get("duration_s"), (result.get("usage") or {}).get("cost")))


def hand_back(store: JobStore, job_id: str, owner: str, relay: ControlRelay, why: str, api_key: str | None) -> None:
    """The job goes back to the queue with this attempt's counts and is dispatched again at once (if the broker
    refuses, a worker's reconciler dispatches it later)."""
    snapshot = relay.progress.snapshot()
    try:
        handed = store.hand_back(job_id, owner, snapshot["turns"], snapshot["tool_calls"], snapshot["usage"])
    except Exception:
        log.exception("job %s: handing it back", job_id)   # its lease lapses; the sweep puts it back then
        return
    if not handed:
        return
    jobs_log.info("job %s handed back to the queue (%s): it runs again on the next worker", job_id, why)
    try:
        dispatch(job_id, api_key, store=store)
    except Exception as exc:
        log.warning("job %s: dispatching it again: %s (a worker's reconciler will)", job_id, exc)


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


def dispatch(job_id: str, api_key: str | None = None, store: JobStore | None = None,
             previous: float | None = None, reconcile: bool = False) -> bool:
    """Publish the job's message, recording it in the store first (the reconciler reads that record). With
    reconcile, only if no other worker re-dispatched it since `previous`: returns False then. A failed publish
    is recorded and raised."""
    store = store or default_store()
    if not store.mark_dispatched(job_id, previous, only_if=reconcile):
        return False
    try:
        run_job_task.apply_async(args=[job_id], kwargs={"api_key": api_key} if api_key else {}, task_id=job_id)
    except Exception as exc:
        store.mark_undispatched(job_id, f"{type(exc).__name__}: {exc}")
        raise
    return True


def node_name() -> str:
    """Celery's node name for this worker: unique per process, so several workers share a host on every broker."""
    return f"pid-{os.getpid()}-{uuid.uuid4().hex[:4]}@{socket.gethostname()}"


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


def _pool_processes() -> list[int]:
    """The pids of this process's children: the worker's pool processes."""
    me, found = str(os.getpid()), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == me:
                    found.append(int(entry))
        except (OSError, IndexError):
            continue
    return found


class WorkerSignals:
    """The worker's main process. The first Ctrl-C takes no new job and lets the running ones end, then stops the
    worker (Celery's own warm shutdown would kill a job whose process is its own). SIGTERM, SIGHUP or a second Ctrl-C
    tell the running jobs to hand themselves back, then stop once they have; a third Ctrl-C is Celery's: stop now
    (a job stopped so keeps its record: the next worker's sweep sees its process gone and runs it again)."""

    def __init__(self, consumer: Any) -> None:
        from celery.worker import state
        self.consumer, self.state = consumer, state
        self.taking_jobs = True
        self._interrupts = 0
        self._celery_int = signal.getsignal(signal.SIGINT)
        self._celery_term = signal.getsignal(signal.SIGTERM)

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            try:
                signal.signal(sig, self._on_signal)
            except ValueError:   # not the main thread: Celery's handling stays
                return

    def running(self) -> int:
        return len(self.state.reserved_requests)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts == 1 and self.running():
                self._drain()
                return
            if self._interrupts >= 3 and callable(self._celery_int):
                self._celery_int(signum, frame)
                return
        running = self.running()
        if running:
            jobs_log.info("stopping: handing %d running job(s) back to the queue", running)
        self._stop_taking_jobs()   # first: the jobs handed back must go to another worker
        for child in _pool_processes():
            try:
                os.kill(child, signal.SIGTERM)
            except OSError:
                pass
        if callable(self._celery_term):
            self._celery_term(signum, frame)   # Celery's warm shutdown: waits for the jobs to hand themselves back

    def _stop_taking_jobs(self) -> None:
        if not self.taking_jobs:
            return
        self.taking_jobs = False
        try:
            self.consumer.cancel_task_queue(QUEUE)
        except Exception:
            log.exception("no longer taking jobs")

    def _drain(self) -> None:
        jobs_log.info("stopping: no new jobs; waiting for %d running job(s) to end (Ctrl-C again: hand them back "
                      "to the queue and stop)", self.running())
        self._stop_taking_jobs()

        def stop_when_idle() -> None:
            while self.state.reserved_requests:
                time.sleep(0.5)
            if self._interrupts == 1:
                os.kill(os.getpid(), signal.SIGTERM)   # nothing runs now: stop

        threading.Thread(target=stop_when_idle, name="pid-stop-when-idle", daemon=True).start()


def _take_only_what_can_start(consumer: Any, concurrency: int) -> None:
    """The embedded queue: take a message only when a process is free to start it at once, so that a busy worker
    never holds a job another worker could run (Celery's worker_disable_prefetch does this for Redis only)."""
    from celery.worker import state
    try:
        qos = consumer.task_consumer.channel.qos
    except AttributeError:
        return
    can_consume = qos.can_consume

    def only_when_free() -> bool:
        return len(state.reserved_requests) < concurrency and can_consume()
    qos.can_consume = only_when_free


@signals.worker_ready.connect
def _start_housekeeping(sender: Any = None, **_: Any) -> None:
    """In the worker's main process: take over the stop signals, say it is ready, start the housekeeping."""
    from worker.app import embedded_broker
    from worker.housekeeping import Housekeeping
    concurrency = getattr(getattr(sender, "controller", None), "concurrency", None) or 1
    if embedded_broker():
        _take_only_what_can_start(sender, concurrency)
    stops = WorkerSignals(sender)
    stops.install()
    if sender.connection.transport.driver_type == "amqp":   # see start_only_what_can_start
        sender.timer.call_repeatedly(0.5, _resume_consuming, (sender, concurrency, lambda: stops.taking_jobs))
    node = getattr(sender, "hostname", None) or node_name()
    housekeeping = Housekeeping(node, concurrency, stops.running, lambda: stops.taking_jobs, on_end=_log_swept)
    housekeeping.start()
    signals.worker_shutdown.connect(lambda **_: housekeeping.stop(), weak=False)
    jobs_log.info("pid worker ready (%s, %d at once): waiting for jobs (Ctrl-C: finish the running jobs, then stop; "
                  "twice: hand them back and stop)", node, concurrency)
