"""Jobs whose process died: found by their lapsed lease, or at once when their process on this host is gone; then
put back in the queue (a worker's reconciler dispatches them again) or ended, truthfully.

Workers sweep every few seconds; `pid run`, `pid list` and `pid status` sweep too, so a `pid run` killed with SIGKILL
is ended by the next command. No Celery here: dispatching is worker/housekeeping.py's.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from typing import Any, Callable

from pid.endings import ENDINGS, ExitReason, status_of
from pid.jobs.results import log_job, with_earlier_attempts
from pid.jobs.identity import proc_stat, process_alive
from pid.jobs.spec import JobSpec, write_json_atomic
from pid.jobs.store import ALIVE_WITHIN_S, JobRecord, Store, WorkerBeat
from pid.output_dirs import make_marked
from pid import settings

log = logging.getLogger("pid.worker")

MAX_ATTEMPTS = settings.MAX_ATTEMPTS.get()   # a job whose worker was lost this often has failed

# A worker's process seen alive on this host keeps its lapsed lease this much longer: the job store was out of
# reach for a while (no worker could renew), and the worker renews at its first poll that reaches it again. Put back
# at once, the job had run again from the start beside the first attempt (found by a new-user test: a 40 s Redis
# outage). A worker stopped or hung for longer loses the job then, as one that died loses it when its lease lapses.
ALIVE_GRACE_S = 300.0
# A lease held on another host: its process cannot be seen from here, so the workers' heartbeats stand in for it
# within the same grace (store_just_back); a worker back from a silence the lapse fell in holds it off for a lease
LEASE_S = settings.LEASE_S.get()

Ended = Callable[[JobRecord], None]


def sweep(store: Store, *, on_end: Ended | None = None) -> list[str]:
    """Running jobs whose process is gone: a worker's goes back to the queue or, lost MAX_ATTEMPTS times, fails
    (`worker_lost`); a `pid run`'s fails (`client_lost`): nobody can take it up. Each one's containers go with it.
    Returns the ids ended."""
    ended = []
    now = store.now()   # the clock the store's times are on
    beats: list[WorkerBeat] | None = None   # read once, and only for a lapsed lease held on another host
    for record in store.suspects(host=socket.gethostname()):
        lapsed = (record.lease_until or 0) < now
        alive = owner_alive(record)   # None: not knowable from here (another host): lease and heartbeats decide
        if (not lapsed and alive is not False) or (lapsed and alive and record.kind == "run"):
            continue  # alive; a `pid run` stopped (Ctrl-Z, a suspended machine) renews its lease when it goes on
        written = _written_result(record, store)
        if written is None and lapsed and alive is not False and now - (record.lease_until or 0) < ALIVE_GRACE_S:
            if alive or record.kind == "run":
                # a live worker cut off from the store renews at its first poll that reaches it; so does a `pid run`
                # on another host (its machine suspended, its network gone a while): nothing here tells it from a
                # dead one, and nobody runs it again, so only the grace can end it
                continue
            beats = store.workers() if beats is None else beats
            if store_just_back(record, beats, now):
                continue
        if written is not None:   # it ended and wrote result.json, then died before telling the store: that holds
            if store.finish(record.id, written["exit_reason"], owner=record.owner, error=written.get("error"),
                            turns=written.get("turns"), tool_calls=written.get("tool_calls"),
                            lapsed_only=lapsed, check=written.get("check")):
                ended.append(record.id)
                _remove_containers(record.id, record.attempts)
                if on_end:
                    on_end(store.get(record.id) or record)
            continue
        if record.cancel_requested:  # cancelled, then its process died: it ends cancelled, not queued again
            reason: ExitReason = "cancelled"
            error = None
        elif record.kind == "run" and alive is False:
            reason, error = "client_lost", (f"the `pid run` process that ran this job ({_who(record)}) ended "
                                                "without finishing it (killed?); a foreground job is not run again")
        elif record.kind == "run":
            reason, error = "client_lost", (f"the `pid run` process that ran this job ({_who(record)}) has not been "
                                            f"heard from for {now - (record.lease_until or now):.0f}s (killed, or its "
                                            "machine away); a foreground job is not run again")
        elif record.losses >= MAX_ATTEMPTS:
            reason, error = "worker_lost", (f"worker lost {record.losses} time(s) ({_who(record)} last): "
                                                "the job is not dispatched again")
        else:
            if store.requeue(record.id, record.owner, lapsed_only=lapsed):
                _remove_containers(record.id, record.attempts)
                now_record = store.get(record.id) or record
                if now_record.status == "cancelled":   # cancelled between our look and the requeue
                    ended.append(record.id)
                    write_unrun_result(record.spec, "cancelled", None, now_record, store=store)
                    if on_end:
                        on_end(now_record)
                    continue
                silent = now - (record.lease_until or now)   # (a process unseen from here: its lease said it)
                how = "is gone" if alive is False else f"has not renewed its lease for {silent:.0f}s (dead, frozen?)"
                log.warning("job %s: its worker process (%s) %s; back in the queue", record.id, _who(record), how)
                log_job(store, record.id, "queued", f"its worker ({_who(record)}) was lost: back in the queue")
            continue
        if store.finish(record.id, reason, owner=record.owner, error=error, lapsed_only=lapsed):
            ended.append(record.id)
            log_job(store, record.id, status_of(reason), f"{reason}: {error}" if error else reason, exit_reason=reason)
            write_unrun_result(record.spec, reason, error, record, store=store)
            if not (record.kind == "run" and alive is None):   # (a run elsewhere may come back to its container;
                _remove_containers(record.id, record.attempts)    # if it never does, the reaper's time to live)
            if on_end:
                on_end(store.get(record.id) or record)
    return ended


def store_just_back(record: JobRecord, beats: list[WorkerBeat], now: float) -> bool:
    """Whether a lease held on another host lapsed because the store was out of reach, rather than because its holder
    died (found by a new-user test: after a 40 s Redis outage, another host's sweep ran a live worker's jobs again).
    The heartbeats tell: its holder beats again, a worker was cut off from the store when the lease lapsed and is back
    (so may the holder be, a moment later), or no worker that was there then reaches the store yet."""
    lapse = record.lease_until or 0
    live = [b for b in beats if b.stopped_at is None]
    host, pid = _owner(record)
    identity = _owner_identity(record)
    if identity and any((b.host, b.pid, b.identity) == (host, pid, identity) and b.beat_at > lapse for b in live):
        return True   # it renews the lease at its next poll
    if any(b.silent_since is not None and b.resumed_at is not None and b.silent_since <= lapse <= b.resumed_at
           and now - b.resumed_at < LEASE_S for b in live):
        return True
    # (Not asked of a `pid run`: it has no heartbeat, the workers' silence says nothing of it; sweep() gives it the
    # grace.)
    # A worker that has reached the store without a break for twice the time a beat may be missed knows it up as well
    # (a worker started after the lapse: the dead one's replacement, which would otherwise wait out the whole grace)
    return not any(now - b.beat_at <= ALIVE_WITHIN_S and
                   (b.started_at < lapse or now - (b.resumed_at or b.started_at) > 2 * ALIVE_WITHIN_S) for b in live)


def _written_result(record: JobRecord, store: Store | None = None) -> dict[str, Any] | None:
    """The result.json this attempt wrote, if it got that far (pid's own file, but read bounded all the same): in
    the job's directory here, or (its worker on another machine) the one it stored, if it says it is this
    attempt's."""
    path = os.path.join(record.spec.job_dir, "result.json")
    try:
        if os.stat(path).st_mtime < (record.claimed_at or record.started_at or record.created_at):
            raise FileNotFoundError(path)   # an earlier run's
        with open(path, "rb") as f:
            result = json.loads(f.read(1 << 20))
        if isinstance(result, dict) and result.get("attempt", record.attempts) != record.attempts:
            raise ValueError("an earlier attempt's")   # (one that says none, an older pid's, is taken as this one's)
    except (OSError, ValueError):
        result = _stored_result(record, store)
    if not isinstance(result, dict) or result.get("id") != record.id or result.get("exit_reason") not in ENDINGS:
        return None
    return result


def _stored_result(record: JobRecord, store: Store | None) -> dict[str, Any] | None:
    if store is None:
        return None
    from pid.jobs.artifact_store import read_result
    try:
        result = read_result(store, record.id)
    except Exception:
        return None
    return result if result is not None and result.get("attempt") == record.attempts else None


def sweep_quietly(store: Store | None = None) -> None:
    """The CLI's sweep: never fatal."""
    try:
        from pid.jobs.store import default_store
        sweep(store or default_store())
    except Exception:
        log.debug("sweeping lost jobs", exc_info=True)


def cancel_job(store: Store, job_id: str) -> str | None:
    """Cancel a job: a queued one ends here and now (with its result.json), a running one through its worker, or
    here and now too if its process is gone (the sweep sees to that, and to its containers)."""
    was = store.get(job_id)
    status = store.request_cancel(job_id)
    if was is not None and was.status == "queued" and status == "cancelled":
        write_unrun_result(was.spec, "cancelled", None, store=store)
        log_job(store, job_id, "cancelled", "cancelled while queued: it never ran", exit_reason="cancelled")
    elif status == "running":
        sweep_quietly(store)
        record = store.get(job_id)
        status = record.status if record else status
    return status


def write_unrun_result(spec: JobSpec, exit_reason: ExitReason, error: str | None,
                       record: JobRecord | None = None, store: Store | None = None) -> None:
    """result.json for a job that ended without running to its end here, so consumers always find one; with its
    record, the counts it had reached (turns, tool calls, every attempt's usage). With the store, it goes there too
    (and the transcript, where this machine has it), for clients on any machine: just after the end is recorded,
    since recording the end is what decides who ends the job. Never raises: an out dir that cannot be written only
    costs the local file."""
    from pid.agent import Outcome   # here, not at the top: `pid list` loads the agent only when it ends a job
    from pid.jobs.results import build_result, client_is_local, spool_dir
    # where the job worked here: a cluster's job in its attempt's spool (the record's last; 0: none ran here),
    # never the --out its submitter named
    spooled = store is not None and not client_is_local()
    job_dir = spool_dir(spec.id, record.attempts if record is not None else 0) if spooled else spec.job_dir
    session = os.path.join(job_dir, "session.jsonl")
    artifacts: dict[str, Any] = {}
    if os.path.exists(session):
        artifacts["session"] = "session.jsonl"
    if record is None:
        result = build_result(spec, Outcome(exit_reason, error=error), time.time(), artifacts)
    else:
        started = record.started_at or record.created_at
        result = build_result(spec, Outcome(exit_reason, turns=record.turns, tool_calls=record.tool_calls,
                                            error=error), started, artifacts)
        result["usage"] = record.usage or result["usage"]
        with_earlier_attempts(result, record.earlier)
    if store is not None:
        from pid.jobs.artifact_store import upload_artifacts
        upload_artifacts(store, spec, job_dir, result)
        if job_dir != spec.job_dir:   # the store has it all: the spool goes, as it does after a run
            shutil.rmtree(job_dir, ignore_errors=True)
            return
    try:
        make_marked(job_dir)
        write_json_atomic(os.path.join(job_dir, "result.json"), result)
    except OSError as exc:
        log.warning("job %s: cannot write result.json in %s: %s", spec.id, job_dir, exc)


def owner_alive(record: JobRecord) -> bool | None:
    """Is the process holding the job's lease still there? Knowable only on its own machine and in its own pid
    namespace (None elsewhere): the owner's identity (worker/control.new_owner) names its boot, namespace and start
    time, so a pid reused by another process, or a host of the same name, cannot pass for it."""
    host, pid = _owner(record)
    if host != socket.gethostname() or pid is None:
        return None
    identity = _owner_identity(record)
    if not identity:   # an owner recorded by an older pid: judged by the start time against the claim
        return _alive_since(pid, record.claimed_at or record.started_at or record.created_at)
    return process_alive(host, pid, identity)


def _alive_since(pid: int, claimed_at: float) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    started = _process_start(pid)
    if started is None:
        return True
    state, since = started
    return state != "Z" and since <= claimed_at + 1


def _process_start(pid: int) -> tuple[str, float] | None:
    """(state, start time in epoch seconds) from /proc, or None where there is no /proc."""
    fields = proc_stat(pid)
    if fields is None:
        return None
    try:
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
        return fields[0], boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def _owner(record: JobRecord) -> tuple[str, int | None]:
    parts = (record.owner or "").rsplit(":", 2)
    if len(parts) != 3:
        return "", None
    try:
        return parts[0], int(parts[1])
    except ValueError:
        return parts[0], None


def _owner_identity(record: JobRecord) -> str:
    """The lease holder's process identity (worker/control.new_owner), "" for an owner recorded without one."""
    return (record.owner or "").rsplit(":", 1)[-1].partition(".")[2]


def _who(record: JobRecord) -> str:
    host, pid = _owner(record)
    return f"pid {pid} on {host}" if pid is not None else (record.owner or "unknown")


def _remove_containers(job_id: str, attempt: int | None = None) -> None:
    """The dead process's container goes now rather than at its expiry, and with it the job's disk (whose lock
    died with the process). Only that attempt's: the job may already run again elsewhere."""
    try:
        from pid.config import pid_home
        from pid.sandbox import remove_job_containers
        from pid.sandbox.reaper import owner_label, reap_gone
        remove_job_containers(job_id, attempt=attempt)
        reap_gone(pid_home(), owner_label(pid_home()))   # (with the job's disk, a dead worker's pool and its disks)
    except Exception:
        log.debug("job %s: removing its containers and disk", job_id, exc_info=True)
