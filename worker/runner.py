"""One job runner for both paths (`pid run` in the foreground, the Celery task in a worker), in four phases:

    prepare (worker/job_prepare.py: model, sandbox, workspace, session, agent)
        -> run the agent
        -> collect (worker/job_collect.py: the ending made true, the patch, the files, the --check)
        -> record (worker/job_record.py: result.json, stored and written)

The workspace is the tree `submit` packed (a blob), a git URL cloned for the job, or a directory (`pid run`).

The phases share a JobRun (worker/job_run.py). The sandboxes are removed in a `finally`, whatever the ending;
result.json is always written, and its status is true: a job whose sandbox died or whose artifacts could not be
made is never `completed`.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

from pid import events as ev
from pid.agent import Agent, Outcome
from pid.endings import ExitReason
from pid.sandbox_api import BadWorkspace, SandboxError
from pid.sandbox_lifecycle import JobSandbox, SandboxProvider
from pid.sandbox import DockerProvider, ImageNotFound
from pid.jobs.blobs import Blobs
from pid.jobs.results import client_is_local, spool_dir
from pid.worker.job_collect import collect
from pid.worker.job_prepare import CheckIn, Gate, JobCancelled, prepare
from pid.worker.job_record import record, record_unstarted
from pid.worker.job_run import JobRun, describe, owns
from pid.jobs.spec import JobSpec
from pid.output_dirs import make_marked
from pid.worker.sandbox_start import abandon
from pid.jobs.store import Store

AgentHook = Callable[[Agent], None]


def run_job(spec: JobSpec, *, api_key: str | None = None, sink: ev.EventSink = ev.ignore,
            on_agent: AgentHook | None = None, cancel: threading.Event | None = None,
            still_owner: Callable[[], bool] = lambda: True, holds_lease: Callable[[], bool] = lambda: True,
            starting: "Future[JobSandbox] | None" = None,
            sandboxes: SandboxProvider[Any] | None = None,
            amend_result: Callable[[dict[str, Any]], None] | None = None, attempt: int = 1,
            blobs: Blobs | None = None, artifact_store: Store | None = None, keep: Store | None = None,
            gate: Gate | None = None, check_in: CheckIn | None = None,
            earlier: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Run one job to its end and return result.json's content. Never raises for job failures.

    `starting` is the job's sandbox already being created (sandbox_start.start_sandbox); else it is created here,
    by `sandboxes` (Docker's by default). The workspace comes from `blobs` (default_blobs()) when the spec has one.

    `attempt` is the job's attempt this run is (its containers carry it). `still_owner` is asked before artifacts
    are made: a worker that lost its lease (another one took the job over), or is stopping, must not overwrite the
    new owner's patch and result; `holds_lease` once more just before they are stored (a long check may have cost
    the lease meanwhile; a stop then no longer matters: the work is done). `amend_result` completes the result
    before it is written (a re-dispatched job adds its earlier attempts' usage).

    With `artifact_store` (a worker's job), the artifacts and then result.json are also stored there, before this
    returns (so before the job's end is recorded): clients on any machine download them. --out is the client's
    path, named by whoever submitted: it is written only where the client is on this machine (client_is_local) and
    it can be made; else the job works in a spool directory under PID_HOME, removed once its artifacts are stored.

    With `keep` (a `pid run` job's store), what `retry` and `continue` need is kept there too: the directory's
    snapshot (stored while the agent works), then the transcript, patch, files and result.json, before this returns.
    Its out directory has them all: a store that refuses them costs those commands, never the job.

    `earlier` are the job's earlier attempts' counts (its store record's): max_cost is the job's, so their cost
    counts. `gate` is asked before every model call (pid/agent.py Limits.gate): a batch's budget stops the job
    there.
    `check_in` too, and as the agent would stop (pid/agent.py Agent): the job's relay applies the store's controls
    then (`on_agent` gave it the agent).
    """
    started, begun = time.time(), time.monotonic()
    try:
        job_dir, spool = job_directory(spec, attempt, spooled=artifact_store is not None)
    except OSError as exc:   # --out unwritable here, and no spool instead: the job fails, saying where and why
        if starting is not None:
            abandon(starting)
        return record_unstarted(spec, f"cannot create the job's directory {spec.job_dir}: {exc.strerror or exc}",
                                started, artifact_store)
    job = JobRun(spec, job_dir, started, attempt, cancel or threading.Event(), sandboxes or DockerProvider(), blobs,
                 sink, starting=starting, earlier=earlier or [], begun=begun)
    stopping: BaseException | None = None   # Ctrl-C, or the process ending: raised again once the job is recorded
    try:
        try:
            agent = prepare(job, api_key=api_key, keep=keep, artifact_store=artifact_store, gate=gate,
                            check_in=check_in)
            job.outcome = run_agent(agent, spec, on_agent)
        except JobCancelled:
            job.outcome = Outcome("cancelled")
        except Exception as exc:  # sandbox or setup failure: a failed job with a readable reason
            job.outcome = set_up_failure(spec, exc)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                job.outcome = Outcome("interrupted", error="interrupted")
            stopping = exc
        owner = collect(job, still_owner) and owns(holds_lease)
    finally:
        job.release(keep)
    result = record(job, owner=owner, spool=spool, amend_result=amend_result, artifact_store=artifact_store,
                    keep=keep)
    if stopping is not None:
        raise stopping
    return result


def set_up_failure(spec: JobSpec, exc: Exception) -> Outcome:
    """The ending of a job whose set-up failed: its input's fault (bad_workspace: no retry would help), the
    sandbox's, or anything else's."""
    if isinstance(exc, ImageNotFound):   # (pid never pulls: the image must be loaded there first)
        if spec.image_id:
            from pid.jobs.continuation import pinned_image_gone
            return Outcome("bad_workspace", error=pinned_image_gone(spec, "is not in this worker's Docker engine"))
        return Outcome("bad_workspace", error=f"{describe(exc)} (on the worker that took the job)")
    reason: ExitReason = ("bad_workspace" if isinstance(exc, BadWorkspace) else
                          "sandbox_error" if isinstance(exc, SandboxError) else "error")
    return Outcome(reason, error=describe(exc))


def run_agent(agent: Agent, spec: JobSpec, on_agent: AgentHook | None) -> Outcome:
    """The agent's run, to its ending (the caller's hook sees the agent first: `pid run` shows it)."""
    if on_agent:
        on_agent(agent)
    outcome = agent.run(spec.task)
    if outcome.exit_reason == "wall_clock":  # the agent's timer had what set-up left; the limit is the job's
        outcome = dataclasses.replace(outcome,
                                      error=f"wall-clock limit of {spec.timeout_s:g}s (--timeout) reached")
    return outcome


def job_directory(spec: JobSpec, attempt: int, spooled: bool) -> tuple[str, str | None]:
    """Where the job's attempt works, and the spool directory to remove at its end (or None). A worker's job
    (`spooled`) works in its attempt's spool when its client is elsewhere, or when --out cannot be made here; else
    OSError says why not."""
    spool = spool_dir(spec.id, attempt) if spooled and not client_is_local() else None
    try:
        make_marked(spool or spec.job_dir)
        return spool or spec.job_dir, spool
    except OSError:
        if not spooled or not _made(spool_dir(spec.id, attempt)):
            raise
        return spool_dir(spec.id, attempt), spool_dir(spec.id, attempt)


def _made(path: str) -> bool:
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        return True
    except OSError:
        return False
