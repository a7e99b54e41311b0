"""The Celery task, in a thread of the worker: it claims the job in the store and runs it beside a ControlRelay
(worker/control.py: lease, cancel/pause/steer/follow-up, progress), records the ending, and prints one line when a
job starts and one when it ends. Told to stop (SIGTERM, SIGHUP, a second Ctrl-C: worker/main_process.py), it hands
the job back to the queue: it runs again on the next worker, never `failed` for it (a job whose agent has ended may
finish its check first: ControlRelay.finishing)."""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import sys
import time
import uuid
import warnings
from typing import Any

from pid.config import EnvDefaults, endpoint
from pid.terminal import ShownLogRecords, one_line
from pid.jobs import policy
from pid.jobs import batch_budget
from pid.worker import warm_pool
from pid.worker.app import app
from pid.worker.control import LEASE_S, ControlRelay, log_undelivered, new_owner, record_end
from pid.jobs.results import end_line, log_end, log_job, result_line, with_earlier_attempts
from pid.jobs.blobs import StoreBlobs
from pid.jobs.dispatch import dispatch
from pid.jobs.publish import TASK
from pid.jobs.spec import JobSpec, spec_problem
from pid.jobs.outage import Patience, patient
from pid.worker.runner import run_job
from pid.worker.sandbox_start import GRACE_S
from pid.jobs.store import JobAttachments, JobRecord, Store, default_store
from pid.jobs.sweep import write_unrun_result

log = logging.getLogger("pid.worker")
jobs_log = logging.getLogger("pid.jobs")   # the worker's own lines: one when a job starts, one when it ends

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class StopRequest:
    """One running job's answer to its worker being told to stop (SIGTERM, SIGHUP, a second Ctrl-C: see
    worker/main_process.py): hand the job back (unless it is finishing: ControlRelay.finishing). `request` only sets
    flags (it is called from a signal handler); the relay's thread stops the agent."""

    def __init__(self) -> None:
        self.relay: ControlRelay | None = None
        self.requested: str | None = _stopping[0]   # a job taken as its worker stops goes back at once

    def request(self, why: str) -> None:
        if self.requested is None:
            self.requested = why
            if self.relay is not None:
                self.relay.request_stop(why)


_running: dict[int, StopRequest] = {}   # this worker's running jobs, by id(): written by their threads
_stopping: list[str | None] = [None]    # why this worker stops, once it does


def hand_back_all(why: str) -> None:
    """Every running job of this worker goes back to the queue (from a signal handler: flags only)."""
    _stopping[0] = why
    for request in list(_running.values()):
        request.request(why)


@app.task(name=TASK, Strategy="pid.worker.main_process:start_only_what_can_start")
def run_job_task(job_id: str, api_key: str | None = None) -> None:
    """Run a job. The message carries only its id: a key given with `submit --api-key` is in the store (for the
    life of the job); `api_key` is read from messages an older client queued, never sent any more."""
    stop = StopRequest()
    _running[id(stop)] = stop
    try:
        _run_claimed(job_id, api_key, stop)
    finally:
        _running.pop(id(stop), None)


def _run_claimed(job_id: str, api_key: str | None, stop: StopRequest) -> None:
    store = default_store()
    owner = new_owner()
    if stop.requested:   # told to stop before it began: the job is not taken, and goes to another worker
        store.mark_undispatched(job_id, f"its worker stopped ({stop.requested}) as it took the job")
        return
    if not store.claim(job_id, owner, LEASE_S):
        record = store.get(job_id)
        if record is None:
            log.error("job %s: a message for a job that is not in the job store (%s): dropped", job_id, store.path)
        elif batch_budget.refused(store, record) is None:
            log.info("job %s not claimed (status %s): duplicate or cancelled delivery", job_id, record.status)
        return
    record = store.get(job_id)
    assert record is not None
    # From here every write of the job's waits out a store outage, until its deadline (pid/jobs/outage.py); the
    # relay's polls do not wait (the next poll tries again).
    polled, store = store, patient(store, Patience(job_id, time.monotonic() + record.spec.timeout_s + GRACE_S))
    if _refused_by_policy(store, record, owner):
        return
    jobs_log.info("job %s started%s: %s", job_id, f" (attempt {record.attempts})" if record.attempts > 1 else "",
                  _short(record.spec.task))
    log_job(store, job_id, "running", f"attempt {record.attempts} started on {socket.gethostname()}",
            attempt=record.attempts)
    relay = ControlRelay(polled, job_id, owner, writes=store)
    stop.relay = relay
    if stop.requested:
        relay.request_stop(stop.requested)
    relay.start()
    result: dict[str, Any] = {"id": job_id, "exit_reason": "error"}
    kept: list[bool] = []   # the runner's last word on whether this process still owns the job (then it wrote)

    def still_owner() -> bool:   # (a job finishing its collection and check as its worker stops is still its)
        kept.append((stop.requested is None or relay.finishing()) and relay.still_owner())
        return kept[-1]

    sink, gate = batch_budget.attach(store, record, relay.on_event)
    try:
        result = run_job(record.spec, api_key=_api_key(store, record.spec, api_key), sink=sink, gate=gate,
                         on_agent=relay.attach, check_in=relay.check_in, cancel=relay.cancel, still_owner=still_owner,
                         holds_lease=relay.still_owner,
                         amend_result=lambda r: with_earlier_attempts(r, record.earlier, record.started_at),
                         attempt=record.attempts,
                         earlier=record.earlier,
                         artifact_store=store, sandboxes=warm_pool.provider(),
                         blobs=StoreBlobs(store))   # (its workspace read waits out an outage)
    except BaseException as exc:   # never a silent failure: the record says what stopped the job
        result["error"] = f"the job was stopped by {type(exc).__name__}: {exc}".strip().rstrip(":")[:500]
        raise
    finally:
        relay.stop()
        if stop.requested and not (kept and kept[-1]):
            hand_back(store, job_id, owner, relay, stop.requested)
        else:
            recorded = record_end(store, job_id, owner, result) or _still_mine(store, job_id, owner)
            line = result_line(job_id, result)
            if recorded:
                jobs_log.info("%s", line)
                log_undelivered(store, job_id, result)
                log_end(store, job_id, result, line)
            else:   # another worker holds the job now: its log and its ending are that attempt's
                jobs_log.info("%s (not recorded: the job is no longer this worker's)", line)
        if record.spec.batch:
            _wake_parked(store, record.spec.batch)


def _still_mine(store: Store, job_id: str, owner: str) -> bool:
    """After the store refused this worker's end: whether the job is still this attempt's all the same (a sweep
    ended it from the result.json this worker wrote, during an outage), so that its end line is its own to log."""
    try:
        record = store.get(job_id)
    except Exception:
        return True
    return record is None or record.owner == owner


def _refused_by_policy(store: Store, record: JobRecord, owner: str) -> bool:
    """A job this worker's policy does not admit, or whose spec is malformed (pid.jobs.spec.spec_problem: written
    into the store past the CLI's checks), ends here, before any container starts: `failed`, `policy_refused`, with
    the rule it breaks."""
    problem = spec_problem(record.spec)
    refusal = (f"the job's spec is malformed: {problem}" if problem else
               policy.active().refusal(record.spec) or _pinned_image_refusal(record.spec))
    if refusal is None:
        return False
    error = f"refused by the policy of worker {socket.gethostname()}: {refusal}"
    record_end(store, record.id, owner, {"exit_reason": "policy_refused", "error": error})
    if problem is None:   # (a malformed spec's directory is not written: its out_dir or id may be anything)
        write_unrun_result(record.spec, "policy_refused", error, record, store=store)
    line = end_line(record.id, "failed", "policy_refused", None, None) + f": {refusal}"
    jobs_log.info("%s", line)
    log_job(store, record.id, "failed", line, exit_reason="policy_refused")
    if record.spec.batch:
        _wake_parked(store, record.spec.batch)
    return True


def _pinned_image_refusal(spec: JobSpec) -> str | None:
    """A retry's or continuation's pinned image (image_id) runs only if it has a name the policy's `images` admits
    now: the store's spec may name any image the engine holds by its id (anyone with the store's URL writes specs)."""
    rules = policy.active()
    if spec.image_id is None or rules.images is None:
        return None
    from pid.sandbox import DockerUnavailable, ImageNotFound, ensure_image
    try:
        attrs = ensure_image(spec.image_id)
    except (ImageNotFound, DockerUnavailable):
        return None   # (it cannot start at all: the sandbox says so, bad_workspace or sandbox_error)
    names = [*(attrs.get("RepoTags") or []), *(attrs.get("RepoDigests") or [])]
    if any(rules.refusal(dataclasses.replace(spec, image=name, image_id=None)) is None for name in names):
        return None
    return (f"the image it runs again ({spec.image_id[:19]}…, then {spec.image}) has no name now that the policy's "
            "images admit")


def _wake_parked(store: Store, batch_id: str) -> None:
    """A slot of the batch is free: its parked jobs go (never fatal: the reconciler does it later otherwise)."""
    try:
        batch_budget.wake_parked(store, batch_id)
    except Exception:
        log.exception("batch %s: dispatching its waiting jobs", batch_id)


def _api_key(store: JobAttachments, spec: JobSpec, from_message: str | None) -> str | None:
    """The job's key: the one submitted with it (in the store), else one an older client's message carried, else
    this worker's own environment's, where the job's endpoint is the one that key is for (PID_BASE_URL, else the
    vendor's own): a job naming another endpoint never receives the worker's key."""
    try:
        stored = store.secret(spec.id)
    except Exception:
        log.exception("job %s: reading its API key from the job store", spec.id)
        stored = None
    if stored or from_message:
        return stored or from_message
    env = EnvDefaults.read()
    key = env.key_for(spec.api, spec.base_url)
    if env.api_key and key is None:
        log.warning("job %s: this worker's API key is for %s, not the job's %s: not sent", spec.id,
                    endpoint(env.api, env.base_url), endpoint(spec.api, spec.base_url))
    return key


def hand_back(store: Store, job_id: str, owner: str, relay: ControlRelay, why: str) -> None:
    """The job goes back to the queue with this attempt's counts and is dispatched again at once (if the broker
    refuses, a worker's reconciler dispatches it later). A key submitted with it stays in the store, for the next
    attempt."""
    snapshot = relay.progress.snapshot()
    try:
        status = store.hand_back(job_id, owner, snapshot["turns"], snapshot["tool_calls"], snapshot["usage"])
    except Exception:
        log.exception("job %s: handing it back", job_id)   # its lease lapses; the sweep puts it back then
        return
    if status == "cancelled":   # its cancel was asked: it ends here, not in the queue
        record = store.get(job_id)
        if record is not None:
            write_unrun_result(record.spec, "cancelled", None, record, store=store)
            _log_swept(record)
        return
    if status != "queued":
        return
    jobs_log.info("job %s handed back to the queue (%s): it runs again on the next worker", job_id, why)
    log_job(store, job_id, "queued", f"its worker stopped ({why}): handed back to the queue")
    try:
        dispatch(job_id, store=store)
    except Exception as exc:
        log.warning("job %s: dispatching it again: %s (a worker's reconciler will)", job_id, exc)


def _short(text: str, width: int = 60) -> str:
    text = one_line(text)
    return text if len(text) <= width else text[:width - 1] + "…"


def node_name() -> str:
    """Celery's node name for this worker: unique per process, so several workers share a host on every broker."""
    return f"pid-{os.getpid()}-{uuid.uuid4().hex[:4]}@{socket.gethostname()}"


def configure_job_lines() -> None:
    """pid's own lines reach the worker's stderr whatever --loglevel quiets (Celery's, httpx's); the warnings that
    say nothing to a pid user go (root is how pid's worker runs: the containers are the isolation). Every line, pid's
    and Celery's, passes through the sanitiser (pid/terminal.py): they carry tasks, servers' errors, names."""
    from celery import signals
    handler = logging.StreamHandler(sys.__stderr__)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"))
    handler.addFilter(ShownLogRecords())
    signals.after_setup_logger.connect(_shown_logs, weak=False)
    signals.after_setup_task_logger.connect(_shown_logs, weak=False)
    jobs_log.addHandler(handler)
    jobs_log.setLevel(logging.INFO)
    jobs_log.propagate = False
    warnings.filterwarnings("ignore", message="You're running the worker with superuser privileges")
    logging.getLogger("kombu.connection").addFilter(
        lambda record: not record.getMessage().startswith("No hostname was supplied"))


def _shown_logs(logger: logging.Logger, **_: Any) -> None:
    """Celery's handlers, once it has made them, print through the sanitiser too."""
    for handler in logger.handlers:
        handler.addFilter(ShownLogRecords())


def _log_swept(record: JobRecord) -> None:
    jobs_log.info("%s", end_line(record.id, record.status, record.exit_reason, record.duration_s,
                                 record.total_usage.get("cost")) + (f": {record.error}" if record.error else ""))

