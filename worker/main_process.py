"""The worker process: how it takes jobs, how it stops, and its housekeeping.

It takes a message only when a slot is free to start it at once, on every broker, so that a busy worker never holds
a job another could run, and no unacknowledged message waits in it (RabbitMQ would close the channel past its
consumer_timeout). It stops in two ways: the first Ctrl-C takes no new job and lets the running ones end; SIGTERM,
SIGHUP or a second Ctrl-C tell the running jobs to hand themselves back (worker/tasks.py) and stop once they have.
Its signal handlers only set flags and send signals: the work is done by the event loop and a watcher thread.
"""
from __future__ import annotations

import faulthandler
import functools
import logging
import os
import re
import resource
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable

from celery import bootsteps, signals

from pid.worker.app import QUEUE, app
from pid.worker.tasks import STOP_SIGNALS, _log_swept, hand_back_all, jobs_log, node_name
from pid import settings

log = logging.getLogger("pid.worker")

HANDBACK_S = 60      # for the running jobs to hand themselves back once the worker is told to stop
FILES_PER_JOB = 32   # descriptors a running job may hold (its disk, channels, model connection, files), generously
FILES_BASE = 256     # the worker's own descriptors
POOL_STOP_S = 10     # for the worker to exit once no job runs
WARM_POOL_CLOSE_S = 5   # then for its warm pool's ready sandboxes to go, if it must exit anyway (the engine may hang)


class Taking:
    """Whether this worker takes new jobs (False once it is stopping), and how many it can run at once."""
    jobs = True
    concurrency = 1
    queues: list[str] = [QUEUE]


def _free_process() -> bool:
    from celery.worker import state
    return Taking.jobs and len(state.reserved_requests) < Taking.concurrency


# -- taking only what can start ------------------------------------------------------------------------------------

class OnlyWhatCanStart(bootsteps.StartStopStep):
    """Every time the consumer starts (also after a reconnection, which rebuilds its channel): on the brokers that
    are asked for each message (the embedded one, Redis), ask only when a process is free."""
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, c: Any) -> None:
        Taking.concurrency = getattr(c.controller, "concurrency", None) or Taking.concurrency
        if c.connection.transport.driver_type == "amqp":
            return   # the broker pushes: see start_only_what_can_start
        try:
            qos = c.task_consumer.channel.qos
        except AttributeError:
            return
        can_consume = getattr(qos, "_pid_can_consume", qos.can_consume)
        qos._pid_can_consume = can_consume
        qos.can_consume = lambda: _free_process() and can_consume()


app.steps["consumer"].add(OnlyWhatCanStart)


def start_only_what_can_start(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Callable[..., Any]:
    """The job task's Celery strategy. On RabbitMQ the broker pushes messages, and one a worker holds without a free
    process to start it stays unacknowledged until one is free: past the broker's consumer_timeout, the broker
    closes the channel and the worker stops. So there the worker consumes only while it has a free slot: it stops
    consuming when its slots are all taken (a timer in the worker starts it again when one is free), and gives
    back, at once, a message that arrives anyway (sent before the pause, or after a reconnection)."""
    from celery.worker.strategy import default
    handle = default(task, app, consumer, **kwargs)
    if consumer.connection.transport.driver_type != "amqp":
        return handle   # the other transports take a message only when asked (OnlyWhatCanStart)

    def on_message(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **more: Any) -> Any:
        if not _free_process():
            log.info("job %s: no free process; the message goes back to the broker", message.headers.get("id"))
            message.reject_log_error(log, consumer.connection_errors, requeue=True)
            _pause_consuming(consumer)
            return None
        handled = handle(message, body, ack, reject, callbacks, **more)
        if not _free_process():
            _pause_consuming(consumer)
        return handled
    return on_message


def _pause_consuming(consumer: Any) -> None:
    for queue in Taking.queues:
        if consumer.task_consumer.consuming_from(queue):
            consumer.task_consumer.cancel_by_queue(queue)   # still selected: a reconnection consumes again


def _resume_consuming(consumer: Any) -> None:
    """In the worker's event loop (RabbitMQ): consume again once a process is free, unless the worker is stopping."""
    task_consumer = consumer.task_consumer
    if task_consumer is None or not _free_process():
        return
    for queue in Taking.queues:
        if task_consumer.consuming_from(queue):
            continue
        try:
            consumer.add_task_queue(queue)
        except Exception as exc:   # the connection is down: Celery reconnects, and consumes again itself
            log.debug("consuming again: %s", exc)
            return


# -- stopping --------------------------------------------------------------------------------------------------------

class WorkerSignals:
    """SIGINT, SIGTERM and SIGHUP in the worker. The first Ctrl-C drains: no new job, the running ones end, then the
    worker stops. SIGTERM, SIGHUP, or Ctrl-C once more: the running jobs are told to hand themselves back
    (worker/tasks.py hand_back_all), and Celery's warm shutdown waits for them. A Ctrl-C after that is Celery's own
    (its second one a cold shutdown), for a worker that still does not stop."""

    def __init__(self) -> None:
        from celery.worker import state
        self.state = state
        self.pid = os.getpid()
        self.draining = False
        self.handing_back = False
        self._celery_int = signal.getsignal(signal.SIGINT)
        self._celery_term = signal.getsignal(signal.SIGTERM)

    def install(self) -> None:
        from celery.apps import worker as celery_worker
        # Celery prints its shutdown line ("worker: Warm shutdown (MainProcess)") past its logging, to stdout: it
        # goes to its log instead, and shows with --loglevel INFO as the rest of Celery's own lines do. (Its other
        # lines, a third Ctrl-C's warning among them, are said as before.)
        celery_worker.safe_say = functools.partial(_say, celery_worker.safe_say)
        for sig in STOP_SIGNALS:
            try:
                signal.signal(sig, self._on_signal)
            except ValueError:   # not the main thread: Celery's handling stays
                return
        threading.Thread(target=self._stop_when_drained, name="pid-stop-when-drained", daemon=True).start()

    def running(self) -> int:
        return len(self.state.reserved_requests)

    def _on_signal(self, signum: int, frame: Any) -> None:
        Taking.jobs = False
        if signum == signal.SIGINT and not self.draining and not self.handing_back and self.running():
            self.draining = True
            jobs_log.info("stopping: no new jobs; waiting for %d running job(s) to end (Ctrl-C again: hand them "
                          "back to the queue and stop)", self.running())
            return
        if self.handing_back:
            if signum == signal.SIGINT and callable(self._celery_int):
                self._celery_int(signum, frame)   # they are already being handed back: Celery's own, now
            return
        self.handing_back = True
        if self.running():
            jobs_log.info("stopping: handing %d running job(s) back to the queue", self.running())
        elif not self.draining:   # (after a first Ctrl-C its jobs ended, and this is the stop it asked for)
            jobs_log.info("stopping (%s): no job is running", signal.Signals(signum).name)
        hand_back_all(signal.Signals(signum).name)
        threading.Thread(target=self._bound_the_stop, name="pid-bound-the-stop", daemon=True).start()
        if callable(self._celery_term):
            self._celery_term(signum, frame)   # Celery's warm shutdown: waits for the jobs to hand themselves back

    def _bound_the_stop(self) -> None:
        """A stop always ends. Jobs get HANDBACK_S to hand themselves back, then the worker POOL_STOP_S to exit on
        its own; after that it exits anyway, its warm pool given WARM_POOL_CLOSE_S to remove its ready sandboxes (a
        hung engine could hold that for minutes: what is left, the next reap removes, its process being gone). A job
        still running then loses its lease holder with this process: the next sweep on this host puts it back at
        once."""
        deadline = time.monotonic() + HANDBACK_S
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.2)
        stuck = self.running()
        if stuck:
            jobs_log.info("stopping: %d job(s) did not hand themselves back within %d s (the next sweep puts them "
                          "back)", stuck, HANDBACK_S)
        time.sleep(POOL_STOP_S)
        jobs_log.info("stopping: the worker did not exit by itself; it exits now")
        from pid.worker import warm_pool
        closing = threading.Thread(target=warm_pool.stop, kwargs={"wait": False}, name="pid-warm-pool-stop",
                                   daemon=True)
        closing.start()   # (one being made is left to the next reap)
        closing.join(WARM_POOL_CLOSE_S)
        logging.shutdown()
        os._exit(1 if stuck else 0)

    def _stop_when_drained(self) -> None:
        while not (self.draining and not self.handing_back and not self.state.reserved_requests):
            time.sleep(0.5)
        os.kill(self.pid, signal.SIGTERM)   # nothing runs now: stop


def _say(celery_say: Callable[..., None], message: str, *rest: Any) -> None:
    if not re.fullmatch(r"worker: \w+ shutdown \(MainProcess\)", message.strip()):
        return celery_say(message, *rest)
    try:   # (from a signal handler: Celery's own never raises)
        logging.getLogger("celery.apps.worker").info(message.strip())
    except Exception:  # noqa: BLE001
        pass


def raise_open_files_limit(concurrency: int) -> int:
    """Raise the soft limit on open files (often 1024) towards the hard one, so that `concurrency` jobs fit; the
    limit in force. A worker that still cannot hold them says so at start rather than failing jobs with EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FILES_BASE + FILES_PER_JOB * concurrency
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(hard, want)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < want:
        jobs_log.warning("this worker may open %d files (ulimit -n), fewer than %d jobs at once may need (%d): raise "
                         "its hard limit or lower --concurrency", soft, concurrency, want)
    return soft


def dump_stacks_on_sigusr2() -> None:
    """`kill -USR2` on a worker writes every thread's stack, by name, to its log: what a worker that does not stop
    is waiting for. A Python handler: it runs in the main thread, between two of its steps (Celery's loop sleeps in
    Python), and takes the frames under the GIL. faulthandler's dump reads other threads' frames without it, and
    could crash the very worker it was asked to look at (it stopped mid-line in CI as a thread ended)."""
    try:
        signal.signal(signal.SIGUSR2, _write_stacks)
    except ValueError:   # not the main thread (never so in `pid worker`): faulthandler's dump, rather than none
        faulthandler.register(signal.SIGUSR2, file=2, all_threads=True, chain=False)


_dumping = False   # a dump is being written (a second SIGUSR2 meanwhile, fd 2 a full pipe, adds none inside it)


def _write_stacks(signum: int, frame: Any) -> None:
    global _dumping
    if _dumping:
        return
    _dumping = True
    try:
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        parts = [f"\nevery thread's stack in pid worker {os.getpid()} (kill -USR2), most recent call last:\n"]
        for ident, top in sys._current_frames().items():
            parts.append(f"\nthread {names.get(ident, '?')} ({ident:#x}):\n" + "".join(traceback.format_stack(top)))
        parts.append(f"end of the stacks of pid worker {os.getpid()}\n")
        data = "".join(parts).encode("utf-8", "replace")
        while data:   # fd 2 is the log (sys.stderr may be Celery's logging proxy)
            data = data[os.write(2, data):]
    except Exception:   # (no log to write to, ...): nothing may be raised into what the main thread was doing
        pass
    finally:
        _dumping = False


@signals.worker_ready.connect
def _start(sender: Any = None, **_: Any) -> None:
    """In the worker, once ready: take over the stop signals, say it is ready, start the housekeeping. A worker that
    cannot do all of it ends at once (exit 1): one without its heartbeat and sweeps would take jobs while `pid workers`
    says no worker is alive, and Celery only logs what a signal handler raises. What it may have taken is its lease's:
    the next sweep hands it back, as after a SIGKILL."""
    try:
        _ready(sender)
    except Exception as exc:
        jobs_log.critical("pid worker cannot start its housekeeping (%s): stopping", exc, exc_info=True)
        logging.shutdown()
        os._exit(1)


def _ready(sender: Any) -> None:
    from pid.sandbox import drop_helper
    from pid.worker.housekeeping import Housekeeping
    Taking.concurrency = getattr(getattr(sender, "controller", None), "concurrency", None) or 1
    Taking.queues = sorted(sender.app.amqp.queues.consume_from or [QUEUE])
    raise_open_files_limit(Taking.concurrency)
    dump_stacks_on_sigusr2()
    stops = WorkerSignals()
    stops.install()
    if sender.connection.transport.driver_type == "amqp":   # see start_only_what_can_start
        sender.timer.call_repeatedly(0.5, _resume_consuming, (sender,))
    node = getattr(sender, "hostname", None) or node_name()
    housekeeping = Housekeeping(node, Taking.concurrency, stops.running, lambda: Taking.jobs, on_end=_log_swept,
                                queues=Taking.queues)
    housekeeping.start()
    signals.worker_shutdown.connect(lambda **_: housekeeping.stop(), weak=False)
    try:
        pool = settings.POOL.get()   # (`pid worker --pool` checked it already; a worker started otherwise)
    except ValueError as exc:
        jobs_log.error("no warm pool: %s", exc)
        pool = settings.PoolSizes()
    if pool.total > 0:
        from pid.worker import warm_pool
        warm_pool.start(pool)
        signals.worker_shutdown.connect(lambda **_: warm_pool.stop(), weak=False)
    signals.worker_shutdown.connect(lambda **_: jobs_log.info("pid worker stopped (%s)", node), weak=False)   # last
    if drop_helper.program() is None:   # (built now, once: not in the first job's start)
        jobs_log.warning("no privilege drop of pid's own here (it is built with a C compiler, `cc` or $CC, on Linux "
                         "x86_64 or aarch64): the agent's commands drop through each task image's setpriv, ~1 ms "
                         "more of the container's CPU per command, and an image without util-linux cannot run them")
    if settings.RESULT_BACKEND.raw():
        jobs_log.info("PID_RESULT_BACKEND is set but no longer used: the job store holds every result")
    jobs_log.info("pid worker ready (%s, %d at once, queue %s%s): waiting for jobs (Ctrl-C: finish the running jobs, "
                  "then stop; twice: hand them back and stop)", node, Taking.concurrency, ",".join(Taking.queues),
                  f", a warm pool of {_pool_words(pool)}" if pool.total > 0 else "")


def _pool_words(pool: settings.PoolSizes) -> str:
    """`4 sandboxes`, `8 sandboxes for swe:latest and 2 for other images`."""
    parts = [f"{n} for {image}" for image, n in pool.per_image]
    if not parts:
        return f"{pool.shared} sandboxes"
    return " and ".join(parts + [f"{pool.shared} for other images"] * bool(pool.shared))


__all__ = ["OnlyWhatCanStart", "WorkerSignals", "start_only_what_can_start"]
