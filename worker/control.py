"""A running job's link to the job store, for a worker's task and for a foreground `pid run` alike: a thread beside
the job renews its lease, carries cancel/pause/steer/follow-up from the store to the agent, and records the job's
progress (turns, tool calls, usage, what it is doing) so that `pid status` shows it and a job stopped cold keeps
true counts. No Celery here: `pid run` uses it without loading the queue.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable

from pid import events as ev
from pid.event_records import EventRecords
from pid.terminal import shown
from pid.agent import Agent, undelivered
from pid.jobs.outage import transient
from pid.jobs.identity import process_identity
from pid.jobs.progress import Progress
from pid.endings import status_of
from pid.jobs.results import attempt_usage, log_end, log_job, result_line
from pid.jobs.store import JobAttachments, Leases, Store
from pid import settings

log = logging.getLogger("pid.worker")

# A job silent for LEASE_S is presumed dead: a worker's is dispatched again, a `pid run`'s is ended by the next sweep.
# (On the job's own host the sweep does not wait for that: it sees that the process is gone.)
LEASE_S = settings.LEASE_S.get()
CONTROL_POLL_S = 0.5      # how quickly cancel, pause and messages reach a running job (one read of the store)
PROGRESS_EVERY_S = 2.0    # how often progress is written, at most; the lease is renewed in the same write
# How long the agent's check-in (before each model call) waits for the relay's pass over the store: a healthy store
# answers in milliseconds, even loaded; one that hangs (Redis gives up after 60 s, SQLite's busy wait after 30 s)
# costs one turn this once, and the check-ins after it do not wait until a pass reads the store again.
CHECK_IN_WAIT_S = 1.0
# A stopping worker hands its jobs back at once, but one whose agent has ended is let finish its collection and check
# this long (its worker waits 60 s for its jobs: worker/main_process.py HANDBACK_S): handed back, it would run its
# whole agent again, paying the model again.
FINISH_ON_STOP_S = 25.0   # (what is left of the 60 s goes to its files, uploads and containers' removal)


def new_owner() -> str:
    """host:pid:nonce.identity: who holds a job's lease. The sweeper reads the host and pid back, and the identity
    (boot id, pid namespace, the process's start time in clock ticks) tells it, exactly, whether that process is still
    the one: immune to clock steps, pid reuse and hosts that share a name (see jobs/sweep.owner_alive)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}.{process_identity(os.getpid()) or ''}"


class EventLog:
    """A job's log records on their way to the store (`pid logs`, `submit --wait`): the agent's threads add them,
    the relay's thread writes them every poll, so a model or tool call never waits on the store. Those a store
    outage kept out wait for the next flush, in order. At most PENDING_MAX wait; past that the oldest go, and a
    record says how many. Once the job is no longer this worker's (disowned) nothing more is written: the log is the
    attempt's that holds the job now."""

    PENDING_MAX = 1000

    def __init__(self, store: JobAttachments, job_id: str) -> None:
        self.store, self.job_id = store, job_id
        self._pending: deque[dict[str, Any]] = deque(maxlen=self.PENDING_MAX)
        self._dropped = 0
        self._disowned = False
        self._lock = threading.Lock()

    def add(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self._disowned:
                return
            self._dropped += len(self._pending) == self.PENDING_MAX   # the oldest goes
            self._pending.append(record)

    def disown(self) -> None:
        """Another worker holds the job (this one was frozen or cut off past its lease): what this attempt still
        says would interleave with that attempt's records (found by a new-user test: a frozen worker's cancel)."""
        with self._lock:
            self._disowned = True
            self._pending.clear()
            self._dropped = 0

    def flush(self, store: JobAttachments | None = None) -> None:
        """Write what waits (to `store`, else the log's own); what an unreachable store refused waits for the next
        flush, and any other failure costs those records, never the job."""
        with self._lock:
            pending, dropped = list(self._pending), self._dropped
            self._pending.clear()
            self._dropped = 0
        if dropped:
            pending.insert(0, {"type": "dropped", "count": dropped, "t": round(time.time(), 3)})
        for n, record in enumerate(pending):
            try:
                (store or self.store).append_event(self.job_id, record)
            except Exception as exc:
                if transient(exc):
                    self._put_back(pending[n:])
                else:
                    log.warning("job %s: %d log record(s) not written to the store", self.job_id, len(pending) - n)
                return

    def _put_back(self, unsent: list[dict[str, Any]]) -> None:
        """Unsent records go back before those added meanwhile; the oldest go past PENDING_MAX, counted."""
        with self._lock:
            newer = list(self._pending)
            kept = (unsent + newer)[-self.PENDING_MAX:]
            self._dropped += len(unsent) + len(newer) - len(kept)
            self._pending.clear()
            self._pending.extend(kept)


class ControlRelay:
    """A thread beside the running job: renews the lease, carries the store's controls to the agent, records
    progress.

    Only this thread reads the store's controls and applies them to the agent, one snapshot at a time (under
    `_applying`), so a pause it applied can never be undone by an older read, and steers and follow-ups reach the
    agent in the order they were posted. The agent's thread never waits on the store: its check-in (before each
    model call and as it would stop) asks this thread for a pass now and waits CHECK_IN_WAIT_S at most."""

    def __init__(self, store: Store, job_id: str, owner: str, writes: Store | None = None,
                 foreground: bool = False) -> None:
        """`store` is polled (an unreachable one: the next poll tries again); `writes`, if given, is the store as
        the job's last writes reach it (its log's last records, its final counts), waiting out an outage.
        `foreground`: a `pid run`'s, which no other process runs again: a job the store no longer counts as its own
        (ended while its machine was away) costs its controls, never the run."""
        self.store, self.job_id, self.owner, self.foreground = store, job_id, owner, foreground
        self.disowned = False   # (foreground) the store ended the run meanwhile
        self._writes = writes or store
        self.cancel = threading.Event()
        self.progress = Progress()
        self._agent: Agent | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pid-control", daemon=True)
        self._reported = self.progress.version   # (the claim recorded the start: nothing to say until a turn)
        self._stop_requested: str | None = None
        self._stop_at = 0.0                      # (time.monotonic()) when it was requested
        self._stopped_it = False                 # the relay cancelled the job for its worker's stop
        self._records = EventRecords()
        self._log = EventLog(store, job_id)
        self._applying = threading.Lock()        # one snapshot of the controls applied at a time
        self._wake = threading.Event()           # a check-in wants a pass now (or stop() ends the thread)
        self._passes = threading.Condition()     # guards the three below
        self._asked = 0                          # check-ins asked so far
        self._answered = 0                       # check-ins answered by a pass that read the store after they asked
        self._store_ok = True                    # the last pass read the store, and no check-in has waited in vain

    def still_owner(self) -> bool:
        """False only when another worker holds the job now; an unreadable store must not lose the artifacts."""
        try:
            return self.store.renew(self.job_id, self.owner, LEASE_S)
        except Exception:
            log.exception("job %s: checking the lease", self.job_id)
            return True

    def attach(self, agent: Agent) -> None:
        """The agent the controls go to, before its first model call; its first check-in (made with `check_in`)
        brings in what was sent while the job was queued."""
        self._agent = agent

    def check_in(self) -> None:
        """The agent's hook (Agent(check_in=...)): a pause, steer, follow-up or cancel sent since the last poll
        takes hold now, not at a poll that may come too late. This thread's pass does the reading and applying;
        the agent waits for it CHECK_IN_WAIT_S at most, and not at all while the store is failing: a model call
        never waits on the store."""
        with self._passes:
            self._asked += 1
            ticket = self._asked
            self._wake.set()
            if not self._store_ok or self._done.is_set() or not self._thread.is_alive():
                return
            if not self._passes.wait_for(lambda: self._answered >= ticket or not self._store_ok, CHECK_IN_WAIT_S):
                self._store_ok = False   # a hung store: the next check-ins go on at once, until a pass succeeds

    def on_event(self, event: ev.Event) -> None:
        self.progress.on_event(event)
        record = self._records(event)
        if record is not None:
            self._log.add(record)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self._log.flush(self._writes)
        try:
            self._report(store=self._writes)
        except Exception:
            log.exception("job %s: recording progress", self.job_id)

    def request_stop(self, why: str) -> None:
        """Stop the job soon, from anywhere (a signal handler included: this only sets flags, which the relay's
        thread acts on). `why`: its worker's reason, said in the job's log (it is no cancel of the user's)."""
        self._stop_at = time.monotonic()
        self._stop_requested = why

    def finishing(self) -> bool:
        """Its agent has ended and a stop has not cancelled it, nor had FINISH_ON_STOP_S go by: its collection and
        check are the job's last work, to be recorded, not handed back."""
        return self._agent is not None and self._agent.ended and not self._stopped_it and \
            (self._stop_requested is None or time.monotonic() - self._stop_at < FINISH_ON_STOP_S)

    def _run(self) -> None:
        renew_every = LEASE_S / 6
        last_write = time.monotonic() - PROGRESS_EVERY_S   # (the first turn is shown at once, then every 2 s at most)
        unreachable = False
        while True:
            self._wake.wait(CONTROL_POLL_S)   # a poll, or sooner when the agent checks in
            if self._done.is_set():
                return
            try:
                owned = self._pass()
                unreachable = False
                self._log.flush()
                now = time.monotonic()
                changed = self.progress.version != self._reported
                if owned and (now - last_write >= renew_every or (changed and now - last_write >= PROGRESS_EVERY_S)):
                    if self._report(renew=True):   # (else the next poll sees who holds the job now)
                        last_write = now
            except Exception as exc:  # the store being briefly unavailable must not kill the job
                self._log.flush()
                if not transient(exc):
                    log.exception("job %s: control relay", self.job_id)
                elif not unreachable:   # once an outage, not every poll
                    log.warning("job %s: the job store is unreachable (%s): the job goes on", self.job_id, exc)
                unreachable = transient(exc)

    def _pass(self) -> bool:
        """One read of the job's controls, applied to the agent; it answers the check-ins asked before it began.
        False: the job is no longer this worker's (it is cancelled here)."""
        with self._passes:
            self._wake.clear()
            answering = self._asked
        read = False
        try:
            with self._applying:
                if self._stop_requested and not self.finishing():
                    self._stopped_it = True
                    self._cancel(f"its worker stops ({self._stop_requested}): the job goes back to the queue")
                controls = self.store.controls(self.job_id, self.owner)
                if (controls is None or not controls.owned) and self.foreground:
                    self.disowned = True
                    self._log.disown()
                    log.warning("job %s: the job store no longer counts this run as running (%s): list, steer, pause "
                                "and cancel no longer reach it; the run goes on", self.job_id,
                                "its record is gone" if controls is None else
                                "another machine ended it while this one was away")
                    self._done.set()   # no more polls
                    read = True
                    return False
                if controls is None or not controls.owned:
                    self._log.disown()
                    if not self.cancel.is_set():
                        log.warning("job %s: no longer this worker's; stopping", self.job_id)
                    self._cancel("this worker no longer holds the job")
                    read = True
                    return False
                if controls.cancel_requested:
                    self._cancel()
                agent = self._agent
                if agent is not None:
                    if controls.mail and not agent.ended:   # (after its end they stay: log_undelivered says so)
                        self._deliver(agent)   # before a resume: what was sent while paused goes in first
                    (agent.pause if controls.paused else agent.resume)()
                read = True
                return True
        finally:
            with self._passes:
                self._store_ok = read
                if read:
                    self._answered = answering
                self._passes.notify_all()

    def _report(self, renew: bool = False, store: Store | None = None) -> bool:
        version = self.progress.version
        if version == self._reported and not renew:
            return True
        ok = (store or self.store).progress(self.job_id, self.owner, **self.progress.snapshot(),
                                            lease_s=LEASE_S if renew else None)
        self._reported = version
        return ok

    def _deliver(self, agent: Agent) -> None:
        for kind, text in self.store.take_messages(self.job_id):
            if not (agent.steer if kind == "steer" else agent.follow_up)(text):   # it ended meanwhile
                log_job(self._writes, self.job_id, "running", undelivered(kind, text))

    def _cancel(self, why: str | None = None) -> None:
        self.cancel.set()
        if self._agent is not None:
            self._agent.cancel(why=why)


def log_undelivered(store: Store, job_id: str, result: dict[str, Any]) -> None:
    """The steers and follow-ups no agent took (sent while the job was collected or checked, after its agent ended):
    the job's log says so, each with its text, before its end line; the CLI had said "queued"."""
    try:
        messages = store.take_messages(job_id)
    except Exception as exc:
        log.warning("job %s: reading its undelivered messages: %s", job_id, exc)
        return
    for kind, text in messages:
        log_job(store, job_id, status_of(result["exit_reason"]), undelivered(kind, text))


def record_end(store: Leases, job_id: str, owner: str, result: dict[str, Any], attempts: int = 6,
               returning: bool = False) -> bool:
    """The job's ending must reach the store, or the sweeper would run a finished job again: retry a busy store.
    False only when the store refused it: the job had ended, or is no longer this owner's. `returning`: a `pid
    run` that another host's sweep ended client_lost while its machine was away (Store.finish)."""
    for attempt in range(attempts):
        try:
            return store.finish(job_id, result["exit_reason"], owner=owner, error=result.get("error"),
                                turns=result.get("turns"), tool_calls=result.get("tool_calls"),
                                usage=attempt_usage(result), check=result.get("check"), returning=returning)
        except Exception as exc:
            if attempts == 1:   # a foreground run: one line, no traceback
                log.warning("job %s: could not record its end in the job store: %s", job_id, exc)
                return True
            log.exception("job %s: recording its end (attempt %d)", job_id, attempt + 1)
            time.sleep(2 ** attempt)
    return True


class ForegroundJob:
    """A `pid run` job in the store, so that `list`, `status`, `steer`, `pause` and `cancel` reach it from another
    terminal. Its process is its only worker: if it dies the job is never dispatched again, the next sweep ends it.
    A store that cannot be written costs those controls, never the run (one warning)."""

    def __init__(self, store: Store | None, relay: ControlRelay | None, spec: Any = None) -> None:
        self.store, self.relay, self.spec = store, relay, spec
        self.cancel = relay.cancel if relay else threading.Event()

    @classmethod
    def start(cls, spec: Any) -> "ForegroundJob":
        from pid.jobs.store import default_store
        try:
            store = default_store()
            store.create(spec, kind="run")
            owner = new_owner()
            if not store.claim(spec.id, owner, LEASE_S):
                raise RuntimeError("the job was claimed by another process")
        except Exception as exc:
            print(shown(f"pid: warning: job {spec.id} is not in the job store ({exc}): list, status, steer, pause "
                        "and cancel will not reach it"), file=sys.stderr)
            return cls(None, None)
        relay = ControlRelay(store, spec.id, owner, foreground=True)
        relay.start()
        return cls(store, relay, spec)

    def sink(self, inner: ev.EventSink) -> ev.EventSink:
        if self.relay is None:
            return inner
        relay = self.relay

        def both(event: ev.Event) -> None:
            relay.on_event(event)
            inner(event)
        return both

    def attach(self, agent: Agent) -> None:
        if self.relay is not None:
            self.relay.attach(agent)

    @property
    def check_in(self) -> Callable[[], None] | None:
        """The agent's check-in hook (Agent(check_in=...)), when the job is in the store."""
        return self.relay.check_in if self.relay is not None else None

    def end(self, result: dict[str, Any] | None, error: str | None = None) -> None:
        """Record the ending. No result: the run stopped before the job could end by itself, by Ctrl-C (no error)
        or by the error given. One attempt: a store that fails now must not hold the terminal."""
        if self.relay is None or self.store is None:
            return
        self.relay.stop()
        ending = result or ({"exit_reason": "error", "error": error} if error else
                            {"exit_reason": "interrupted", "error": "interrupted"})
        returning = self.relay.disowned
        if record_end(self.store, self.relay.job_id, self.relay.owner, ending, attempts=1, returning=returning):
            if returning and result is not None:   # over the client_lost result.json the sweep stored
                from pid.jobs.artifact_store import store_result
                store_result(self.store, self.relay.job_id, result)
            # its log ends as a worker's job's does (`pid logs`: it said nothing of how the job ended)
            log_undelivered(self.store, self.relay.job_id, ending)
            log_end(self.store, self.relay.job_id, ending, result_line(self.relay.job_id, ending))
            if result is None and self.spec is not None:
                self._result_if_none(ending)

    def _result_if_none(self, ending: dict[str, Any]) -> None:
        """A result.json for a run that stopped before it had one (an on_start that raised): one run_job wrote
        as it was interrupted (Ctrl-C: `interrupted`, with its counts and patch) stays."""
        from pid.jobs.artifact_store import read_result
        from pid.jobs.sweep import write_unrun_result
        assert self.spec is not None and self.store is not None
        try:
            if read_result(self.store, self.spec.id) is None and \
                    not os.path.exists(os.path.join(self.spec.job_dir, "result.json")):
                write_unrun_result(self.spec, ending["exit_reason"], ending["error"], store=self.store)
        except Exception as exc:
            log.warning("job %s: could not store its result: %s", self.spec.id, exc)
