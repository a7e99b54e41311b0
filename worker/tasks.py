"""The Celery task and the worker's housekeeping. The task claims the job in the store, keeps its lease alive,
relays cancel/pause/steer/follow-up from the store to the running agent, and records the ending."""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from celery import signals

from pid import events as ev
from pid.agent import Agent, Outcome
from pid.endings import ExitReason
from pid.config import EnvDefaults
from worker.app import app
from worker.jobs import JobSpec, write_json_atomic
from worker.runner import build_result, run_job
from worker.store import JobStore, default_store

log = logging.getLogger("pid.worker")

# A worker silent for LEASE_S is presumed dead and its job may be claimed again; the sweeper looks every SWEEP_EVERY_S.
LEASE_S = float(os.environ.get("PID_LEASE_S", "60"))
SWEEP_EVERY_S = float(os.environ.get("PID_SWEEP_S", "30"))
CONTROL_POLL_S = 0.5      # how quickly cancel, pause and messages reach a running job
MAX_ATTEMPTS = 3


@app.task(name="pid.run_job", acks_late=True)
def run_job_task(job_id: str, api_key: str | None = None) -> dict[str, Any]:
    store = default_store()
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    if not store.claim(job_id, owner, LEASE_S):
        record = store.get(job_id)
        log.info("job %s not claimed (status %s): duplicate or cancelled delivery", job_id,
                 record.status if record else "unknown")
        return {"id": job_id, "skipped": True}
    record = store.get(job_id)
    assert record is not None
    relay = ControlRelay(store, job_id, owner)
    relay.start()
    result: dict[str, Any] = {"id": job_id, "exit_reason": "error"}
    try:
        result = run_job(record.spec, api_key=api_key or EnvDefaults.read().api_key, sink=relay.on_event,
                         on_agent=relay.attach, cancel=relay.cancel, still_owner=relay.still_owner)
    finally:
        relay.stop()
        _record_end(store, job_id, owner, result)
    return result


def _record_end(store: JobStore, job_id: str, owner: str, result: dict[str, Any]) -> None:
    """The job's ending must reach the store, or the sweeper would run a finished job again: retry a busy store."""
    for attempt in range(6):
        try:
            store.finish(job_id, result["exit_reason"], owner=owner,
                         error=result.get("error"), turns=result.get("turns"), tool_calls=result.get("tool_calls"))
            return
        except Exception:
            log.exception("job %s: recording its end (attempt %d)", job_id, attempt + 1)
            time.sleep(2 ** attempt)



class ControlRelay:
    """A thread beside the running job: renews the lease, and carries the store's controls to the agent."""

    def __init__(self, store: JobStore, job_id: str, owner: str) -> None:
        self.store, self.job_id, self.owner = store, job_id, owner
        self.cancel = threading.Event()
        self._agent: Agent | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pid-control", daemon=True)
        self._progress = (0, 0)

    def still_owner(self) -> bool:
        """False only when another worker holds the job now; an unreadable store must not lose the artifacts."""
        try:
            return self.store.renew(self.job_id, self.owner, LEASE_S)
        except Exception:
            log.exception("job %s: checking the lease", self.job_id)
            return True

    def attach(self, agent: Agent) -> None:
        """Called before the agent's first model call: messages sent while the job was queued go in first."""
        self._agent = agent
        record = self.store.get(self.job_id)
        if record is not None and record.paused:
            agent.pause()
        self._deliver(agent)

    def on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.TurnEnd):
            self._progress = (event.turn, self._progress[1] + len(event.tool_results))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        ticks_per_renew = max(1, int(LEASE_S / 4 / CONTROL_POLL_S))
        tick = 0
        reported = (0, 0)
        while not self._done.wait(CONTROL_POLL_S):
            tick += 1
            try:
                if tick % ticks_per_renew == 0 and not self.store.renew(self.job_id, self.owner, LEASE_S):
                    log.warning("job %s: lease lost; stopping", self.job_id)
                    self._cancel()
                record = self.store.get(self.job_id)
                if record is None:
                    continue
                if record.cancel_requested:
                    self._cancel()
                agent = self._agent
                if agent is None:
                    continue
                self._deliver(agent)   # before a resume: a steer sent while paused reaches the very next call
                (agent.pause if record.paused else agent.resume)()
                if self._progress != reported:
                    reported = self._progress
                    self.store.progress(self.job_id, *reported)
            except Exception:  # the store being briefly unavailable must not kill the job
                log.exception("job %s: control relay", self.job_id)

    def _deliver(self, agent: Agent) -> None:
        for kind, text in self.store.take_messages(self.job_id):
            (agent.steer if kind == "steer" else agent.follow_up)(text)

    def _cancel(self) -> None:
        self.cancel.set()
        if self._agent is not None:
            self._agent.cancel()


def dispatch(job_id: str, api_key: str | None = None) -> None:
    run_job_task.apply_async(args=[job_id], kwargs={"api_key": api_key} if api_key else {}, task_id=job_id)


def sweep(store: JobStore) -> None:
    """Jobs whose worker died: dispatch again, or give up after MAX_ATTEMPTS with a result that says why."""
    for record in store.lapsed():
        if record.cancel_requested:  # cancelled, then its worker died: it ends cancelled, not queued again
            if store.finish(record.id, "cancelled", lapsed_only=True):
                write_unrun_result(record.spec, "cancelled", None)
        elif record.attempts >= MAX_ATTEMPTS:
            error = f"worker lost {record.attempts} times"
            if store.finish(record.id, "worker_lost", error=error, lapsed_only=True):
                write_unrun_result(record.spec, "worker_lost", error)
        elif store.requeue(record.id):
            log.warning("job %s: worker lost, dispatching again", record.id)
            dispatch(record.id)


def cancel_job(store: JobStore, job_id: str) -> str | None:
    """Cancel a job: a queued one ends here and now (with its result.json), a running one through its worker."""
    was = store.get(job_id)
    status = store.request_cancel(job_id)
    if was is not None and was.status == "queued" and status == "cancelled":
        write_unrun_result(was.spec, "cancelled", None)
    return status


def write_unrun_result(spec: JobSpec, exit_reason: ExitReason, error: str | None) -> None:
    """result.json for a job that ended without running to its end here, so consumers always find one."""
    os.makedirs(spec.job_dir, exist_ok=True)
    result = build_result(spec, Outcome(exit_reason, error=error), time.time(), {})
    write_json_atomic(os.path.join(spec.job_dir, "result.json"), result)


@signals.worker_ready.connect
def _start_housekeeping(**_: Any) -> None:
    """In the worker's main process: reap this installation's expired containers and orphaned disks, then sweep lost
    jobs; at start and periodically."""
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
                sweep(store)
            except Exception:
                log.exception("sweeping lost jobs")
            time.sleep(SWEEP_EVERY_S)

    threading.Thread(target=loop, name="pid-housekeeping", daemon=True).start()
