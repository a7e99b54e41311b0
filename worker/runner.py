"""One job runner for both paths (`pid run` in the foreground, the Celery task in a worker):

    create sandbox -> import workspace -> run agent -> collect artifacts -> write result.json -> remove container

The workspace is the tree `submit` packed (a blob), a git URL cloned for the job, or a directory (`pid run`).

The container is removed in a `finally`, whatever the ending; result.json is always written, and its status is
true: a job whose sandbox died or whose artifacts could not be made is never `completed`.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time
from concurrent.futures import Future
from typing import Any, BinaryIO, Callable

import docker.errors

from pid import events as ev
from pid.agent import Agent, Limits, Outcome
from pid.endings import ExitReason
from pid.messages import Usage
from pid.prompt import build_system_prompt
from pid.providers import make_provider
from pid.providers.base import ProviderConfig
from pid.session import SessionWriter, iso_time
from pid.tools.base import ToolContext
from pid.tools.registry import default_registry
from pid.sandbox import SandboxError
from pid.sandbox_lifecycle import FilesBudget, JobSandbox, SandboxProvider
from sandbox import DockerProvider
from worker.artifact_store import TranscriptSync, store_result, upload_artifacts, upload_transcript
from worker.blobs import Blobs
from worker.jobs import JobSpec, write_json_atomic
from worker.sandbox_start import COLLECT_TIMEOUT_S, GRACE_S, abandon, sandbox_config
from worker.snapshot import import_into, open_packed
from worker.store import Store
from worker.watchdog import Watchdog

AgentHook = Callable[[Agent], None]


class JobCancelled(Exception):
    """Cancel arrived before the agent started."""


def run_job(spec: JobSpec, *, api_key: str | None = None, sink: ev.EventSink = ev.ignore,
            on_agent: AgentHook | None = None, cancel: threading.Event | None = None,
            still_owner: Callable[[], bool] = lambda: True,
            starting: "Future[JobSandbox] | None" = None,
            sandboxes: SandboxProvider[Any] | None = None,
            amend_result: Callable[[dict[str, Any]], None] | None = None, attempt: int = 1,
            blobs: Blobs | None = None, artifact_store: Store | None = None) -> dict[str, Any]:
    """Run one job to its end and return result.json's content. Never raises for job failures.

    `starting` is the job's sandbox already being created (sandbox_start.start_sandbox); else it is created here,
    by `sandboxes` (Docker's by default). The workspace comes from `blobs` (default_blobs()) when the spec has one.

    `attempt` is the job's attempt this run is (its containers carry it). `still_owner` is asked before artifacts
    are written: a worker that lost its lease (another one took the job
    over) must not overwrite the new owner's patch and result. `amend_result` completes the result before it is
    written (a re-dispatched job adds its earlier attempts' usage).

    With `artifact_store` (a worker's job), the artifacts and then result.json are also stored there, before this
    returns (so before the job's end is recorded): clients on any machine download them. --out is the client's
    path: where this machine cannot make it, the job works in a spool directory under PID_HOME instead, removed once
    its artifacts are stored.
    """
    started = time.time()
    job_dir = spec.job_dir
    spool: str | None = None
    try:
        os.makedirs(job_dir, exist_ok=True)
    except OSError as exc:   # --out unwritable here: a worker's job spools; a `pid run` fails, saying where and why
        if artifact_store is not None:
            spool = job_dir = spool_dir(spec.id)
        if spool is None or not _made(spool):
            if starting is not None:
                abandon(starting)
            failed = build_result(spec, Outcome("error", error=f"cannot create the job's directory {spec.job_dir}: "
                                                                f"{exc.strerror or exc}"), started, {})
            if artifact_store is not None:
                store_result(artifact_store, spec.id, failed)
            return failed
    cancel = cancel or threading.Event()
    outcome = Outcome("error", usage=Usage())
    artifacts: dict[str, Any] = {}
    workspace: dict[str, Any] | None = None   # which snapshot the job runs on, once imported
    sandbox: JobSandbox | None = None
    packed: BinaryIO | None = None   # the packed workspace's stream from the blob store, once opened
    session: SessionWriter | None = None
    syncing: TranscriptSync | None = None
    provider = None
    watchdog = Watchdog()
    try:
        provider = make_provider(ProviderConfig(model=spec.model, base_url=spec.base_url, api_key=api_key,
                                                api=spec.api, provider=_provider_label(spec),
                                                input_cost_per_mtok=spec.input_price,
                                                output_cost_per_mtok=spec.output_price, images=spec.images))
        tools = default_registry()
        if spec.tools:
            tools = tools.subset(spec.tools)
        if starting is not None:
            sandbox, starting = starting.result(), None
        if cancel.is_set():
            raise JobCancelled
        if sandbox is None:
            sandboxes = sandboxes or DockerProvider()
            sandboxes.clear_job(spec.id)  # left by an earlier attempt whose worker died
            if spec.workspace:   # unpacked while the container starts
                packed = open_packed(spec.workspace, blobs)
            sandbox = sandboxes.create(sandbox_config(spec, attempt), workspace=packed)
        watchdog.arm(spec.timeout_s - (time.time() - started) + GRACE_S, sandbox.kill, "wall_clock")
        workspace = import_into(sandbox, spec.repo, spec.workspace, blobs, packed)
        if cancel.is_set():
            raise JobCancelled
        context = ToolContext(sandbox=sandbox, cancel=cancel)
        session = SessionWriter(_fresh(os.path.join(job_dir, "session.jsonl")), cwd=sandbox.workdir)
        if artifact_store is not None:
            syncing = TranscriptSync(artifact_store, spec.id, job_dir, attempt).start()
        session.model_change(provider.config.provider, spec.model)
        session.thinking_level_change("off")
        remaining = max(1.0, spec.timeout_s - (time.time() - started))
        agent = Agent(provider, tools, context, build_system_prompt(tools.specs(), sandbox), session=session,
                      sink=sink, limits=Limits(max_turns=spec.max_turns, wall_clock_s=remaining,
                                               max_cost=spec.max_cost))
        if on_agent:
            on_agent(agent)
        outcome = agent.run(spec.task)
        if outcome.exit_reason == "wall_clock":  # the agent's timer had what set-up left; the limit is the job's
            outcome = dataclasses.replace(outcome, error=f"wall-clock limit of {spec.timeout_s:g}s reached")
    except JobCancelled:
        outcome = Outcome("cancelled")
    except KeyboardInterrupt:
        outcome = Outcome("interrupted", error="interrupted")
        raise
    except Exception as exc:  # sandbox or setup failure: a failed job with a readable reason
        outcome = Outcome("sandbox_error" if _is_sandbox_error(exc) else "error", error=_describe(exc))
    finally:
        if packed is not None:
            packed.close()
        if starting is not None:   # set-up failed before the early sandbox was taken: it goes too
            try:
                sandbox = starting.result()
            except BaseException:
                pass
        watchdog.disarm()
        if provider is not None:
            provider.close()
        if session:
            session.close()
            artifacts["session"] = "session.jsonl"
        if watchdog.fired:   # the wall clock ran out and something was still stuck past the grace period
            outcome = _ended(outcome, "wall_clock",
                             f"wall-clock limit of {spec.timeout_s:g}s reached; the sandbox was removed")
        elif sandbox and outcome.status == "completed" and not sandbox.is_alive():
            outcome = _ended(outcome, "sandbox_error", "the sandbox container is gone")
        try:
            owner = still_owner()
        except Exception:   # the store is unreachable: better no artifacts than overwriting a new owner's
            owner = False
        try:
            if sandbox and owner and not sandbox.removed_by_pid:
                watchdog.arm(COLLECT_TIMEOUT_S, sandbox.kill, "collect")
                problem = _collect(sandbox, spec, job_dir, artifacts)
                watchdog.disarm()
                if watchdog.fired == "collect":
                    problem = f"collecting the artifacts ran out of time ({COLLECT_TIMEOUT_S:g}s)"
                if problem and outcome.status == "completed":
                    outcome = _ended(outcome, "artifact_error", problem)
        finally:
            watchdog.stop()
            if sandbox:
                sandbox.close()
        result = build_result(spec, outcome, started, artifacts, workspace)
        result["attempt"] = attempt   # whose result this is: a sweep elsewhere trusts a stored one of this attempt
        if amend_result:
            amend_result(result)
        if syncing is not None:
            syncing.stop()
        if artifact_store is not None:
            if owner:
                upload_artifacts(artifact_store, spec, job_dir, result)
                _forget(artifact_store, spec.id, f"session.attempt-{attempt}.jsonl")   # session.jsonl is this one's
            else:   # handed back or taken over: this attempt's transcript is kept all the same
                upload_transcript(artifact_store, spec.id, job_dir, attempt)
        if owner:
            try:
                write_json_atomic(os.path.join(job_dir, "result.json"), result)
            except OSError:
                if artifact_store is None:
                    raise
                # the store has it: a --out that vanished here (another machine's path) costs only the local copy
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)
    return result


def _forget(store: Store, job_id: str, name: str) -> None:
    try:
        store.delete_artifact(job_id, name)
    except Exception:   # a stale copy of this attempt's transcript beside its final one: untidy, never harmful
        pass


def spool_dir(job_id: str) -> str:
    """Where a worker job works when the client's --out cannot be made on this machine."""
    from pid.config import pid_home
    return os.path.join(pid_home(), "spool", job_id)


def _made(path: str) -> bool:
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        return True
    except OSError:
        return False


def _ended(outcome: Outcome, reason: ExitReason, error: str) -> Outcome:
    """The same run, with the ending that is true of it."""
    return dataclasses.replace(outcome, exit_reason=reason, error=outcome.error or error)


def _fresh(path: str) -> str:
    """A retried job starts a new transcript; the interrupted attempt's is kept beside it (session.attempt-1.jsonl),
    not appended to."""
    if os.path.exists(path):
        stem, ext = os.path.splitext(path)
        attempt = 1
        while os.path.exists(f"{stem}.attempt-{attempt}{ext}"):
            attempt += 1
        os.replace(path, f"{stem}.attempt-{attempt}{ext}")
    return path


def _collect(sandbox: JobSandbox, spec: JobSpec, job_dir: str, artifacts: dict[str, Any]) -> str | None:
    """Patch and requested files into `artifacts`; what was refused or skipped is listed with its reason.
    Returns why the job's artifacts are incomplete (then a completed job fails), or None."""
    refused: list[dict[str, str]] = []
    problem = None
    try:
        patch = sandbox.export_patch(os.path.join(job_dir, "patch.diff"), spec.max_patch)
        artifacts["patch"] = "patch.diff"
        refused += [{"path": s.path, "reason": s.reason, "artifact": "patch"} for s in patch.dropped]
    except Exception as exc:
        artifacts["patch_error"] = problem = f"no patch: {_describe(exc)}"
    if spec.files:
        try:
            written, skipped = sandbox.export_files(spec.files, os.path.join(job_dir, "files"),
                                                    FilesBudget(spec.max_files_bytes, spec.max_files))
            artifacts["files"] = written
            refused += [{"path": s.path, "reason": s.reason, "artifact": "files"} for s in skipped]
        except Exception as exc:
            artifacts["files_error"] = f"files not collected: {_describe(exc)}"
            problem = problem or artifacts["files_error"]
    if refused:
        artifacts["refused"] = refused
    return problem


def build_result(spec: JobSpec, outcome: Outcome, started: float, artifacts: dict[str, Any],
                 workspace: dict[str, Any] | None = None) -> dict[str, Any]:
    finished = time.time()
    result: dict[str, Any] = {
        "id": spec.id, "status": outcome.status, "exit_reason": outcome.exit_reason,
        "final_message": outcome.final_message, "turns": outcome.turns, "tool_calls": outcome.tool_calls,
        "usage": outcome.usage.to_result(), "model": spec.model, "image": spec.image, "task": spec.task,
        "repo": spec.repo, "started_at": iso_time(started), "finished_at": iso_time(finished),
        "duration_s": round(finished - started, 3), "artifacts": artifacts,
    }
    if workspace is not None:
        result["workspace"] = workspace
    if outcome.error:
        result["error"] = outcome.error
    return result


def _provider_label(spec: JobSpec) -> str:
    return "anthropic" if spec.api.startswith("anthropic") else "openai"


def _is_sandbox_error(exc: BaseException) -> bool:
    return isinstance(exc, (SandboxError, docker.errors.DockerException))


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500] if len(text) > 500 else text
