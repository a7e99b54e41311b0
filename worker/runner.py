"""One job runner for both paths (`pid run` in the foreground, the Celery task in a worker):

    create sandbox -> import workspace -> run agent -> collect the patch -> run the check (--check)
        -> collect the files -> write result.json -> remove container

The workspace is the tree `submit` packed (a blob), a git URL cloned for the job, or a directory (`pid run`).

The container is removed in a `finally`, whatever the ending; result.json is always written, and its status is
true: a job whose sandbox died or whose artifacts could not be made is never `completed`.
"""
from __future__ import annotations

import dataclasses
import os
import posixpath
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, BinaryIO, Callable

import docker.errors

from pid import events as ev
from pid.agent import Agent, Limits, Outcome
from pid.compaction import Compactor
from pid.endings import ExitReason, checks_after
from pid.messages import Message, Usage
from pid.models import model_info, silent_truncation_warning, unknown_model_warning
from pid.prompt import build_system_prompt
from pid.providers import make_provider
from pid.providers.base import ProviderConfig
from pid.session import SessionWriter
from pid.tools.base import ToolContext
from pid.tools.registry import default_registry
from pid.sandbox import SandboxError
from pid.sandbox_lifecycle import FilesBudget, JobSandbox, SandboxProvider
from sandbox import DockerProvider
from jobs.artifact_store import TranscriptSync, keep_run_artifacts, store_result, upload_artifacts, upload_transcript
from jobs.blobs import Blobs, StoreBlobs
from jobs.continuation import Parent, apply_patch, load_parent, start_session
from worker.check import Check, run_check
from jobs.results import build_result, client_is_local, spool_dir
from jobs.spec import JobSpec, write_json_atomic
from worker.sandbox_start import COLLECT_TIMEOUT_S, GRACE_S, abandon, sandbox_config
from jobs.snapshot import DirSnapshot, import_into, is_directory_repo, open_packed
from jobs.store import JobAttachments, Store, default_store
from jobs.trees import remove_tree
from worker.watchdog import Watchdog

AgentHook = Callable[[Agent], None]
CHECK_START_TIMEOUT_S = 300.0   # the check's fresh sandbox must be up by then (else the check could not run)


class JobCancelled(Exception):
    """Cancel arrived before the agent started."""


def run_job(spec: JobSpec, *, api_key: str | None = None, sink: ev.EventSink = ev.ignore,
            on_agent: AgentHook | None = None, cancel: threading.Event | None = None,
            still_owner: Callable[[], bool] = lambda: True,
            starting: "Future[JobSandbox] | None" = None,
            sandboxes: SandboxProvider[Any] | None = None,
            amend_result: Callable[[dict[str, Any]], None] | None = None, attempt: int = 1,
            blobs: Blobs | None = None, artifact_store: Store | None = None, keep: Store | None = None,
            gate: Callable[[], tuple[ExitReason, str] | None] | None = None) -> dict[str, Any]:
    """Run one job to its end and return result.json's content. Never raises for job failures.

    `starting` is the job's sandbox already being created (sandbox_start.start_sandbox); else it is created here,
    by `sandboxes` (Docker's by default). The workspace comes from `blobs` (default_blobs()) when the spec has one.

    `attempt` is the job's attempt this run is (its containers carry it). `still_owner` is asked before artifacts
    are written: a worker that lost its lease (another one took the job
    over) must not overwrite the new owner's patch and result. `amend_result` completes the result before it is
    written (a re-dispatched job adds its earlier attempts' usage).

    With `artifact_store` (a worker's job), the artifacts and then result.json are also stored there, before this
    returns (so before the job's end is recorded): clients on any machine download them. --out is the client's
    path, named by whoever submitted: it is written only where the client is on this machine (client_is_local) and
    it can be made; else the job works in a spool directory under PID_HOME, removed once its artifacts are stored.

    With `keep` (a `pid run` job's store), what `retry` and `continue` need is kept there too: the directory's
    snapshot (stored while the agent works), then the transcript, patch, files and result.json, before this returns.
    Its out directory has them all: a store that refuses them costs those commands, never the job.

    `gate` is asked before every model call (pid/agent.py Limits.gate): a batch's budget stops the job there.
    """
    started = time.time()
    job_dir = spec.job_dir
    spool: str | None = None
    if artifact_store is not None and not client_is_local():
        spool = job_dir = spool_dir(spec.id)
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
    snapshot: DirSnapshot | None = None   # a directory repo (`pid run`), as the job saw it
    session: SessionWriter | None = None
    syncing: TranscriptSync | None = None
    provider = None
    watchdog = Watchdog()
    try:
        model = model_info(spec.model, {"context_window": spec.context_window,
                                        "input_price": spec.input_price or None,
                                        "output_price": spec.output_price or None,
                                        "cache_read_price": spec.cache_read_price or None,
                                        "cache_write_price": spec.cache_write_price or None})
        if spec.max_cost is not None and not (model.input_price or model.output_price or model.cache_read_price
                                              or model.cache_write_price):
            # The client found prices (its own model table); this worker's table has none: the cap could never
            # stop the job, so it does not start.
            raise ValueError(f"--max-cost needs the model's prices, and {spec.model!r} has none where the job runs "
                             "(this worker's model table does not price it): pass --input-price/--output-price")
        provider = make_provider(ProviderConfig(model=spec.model, base_url=spec.base_url, api_key=api_key,
                                                api=spec.api, provider=_provider_label(spec),
                                                input_cost_per_mtok=model.input_price,
                                                output_cost_per_mtok=model.output_price,
                                                cache_read_cost_per_mtok=model.cache_read_price,
                                                cache_write_cost_per_mtok=model.cache_write_price,
                                                model_max_tokens=model.max_tokens if model.known else None,
                                                max_tokens=spec.max_tokens,
                                                thinking=spec.thinking,
                                                max_retry_wait_s=spec.max_retry_wait,
                                                retry_budget_s=spec.retry_budget, images=spec.images))
        tools = default_registry()
        if spec.tools:
            tools = tools.subset(spec.tools)
        if starting is not None:
            sandbox, starting = starting.result(), None
        if cancel.is_set():
            raise JobCancelled
        if sandbox is None:
            sandboxes = sandboxes or DockerProvider()
            if attempt > 1:   # an earlier attempt's container, left by a worker that died (a first has none)
                sandboxes.clear_job(spec.id)
            if spec.workspace:   # unpacked while the container starts
                packed = open_packed(spec.workspace, blobs)
            sandbox = sandboxes.create(sandbox_config(spec, attempt), workspace=packed)
        watchdog.arm(spec.timeout_s - (time.time() - started) + GRACE_S, sandbox.kill, "wall_clock")
        if is_directory_repo(spec.repo, spec.workspace):
            assert spec.repo is not None
            snapshot = DirSnapshot(spec.repo, spec.max_workspace)
        workspace = import_into(sandbox, spec.repo, spec.workspace, blobs, packed, snapshot)
        if snapshot is not None and keep is not None:
            sink = _keeping_once_answered(sink, snapshot, StoreBlobs(keep))
        parent: Parent | None = None
        earlier: list[tuple[str | None, Message]] = []
        if spec.parent:   # `pid continue`: the parent's patch onto the same snapshot, its conversation loaded
            parent, earlier = load_parent(artifact_store or default_store(), spec.parent, job_dir)
            apply_patch(sandbox, parent.patch)
        if cancel.is_set():
            raise JobCancelled
        context = ToolContext(sandbox=sandbox, cancel=cancel)
        session = SessionWriter(_fresh(os.path.join(job_dir, "session.jsonl")), cwd=sandbox.workdir,
                                parent_session=parent.session_path if parent else None)
        if parent:
            start_session(session, parent)
        if artifact_store is not None:
            syncing = TranscriptSync(artifact_store, spec.id, job_dir, attempt).start()
        session.model_change(provider.config.provider, spec.model)
        session.thinking_level_change(spec.thinking)
        remaining = max(1.0, spec.timeout_s - (time.time() - started))
        system_prompt = build_system_prompt(tools.specs(), sandbox, custom=spec.system_prompt)
        agent = Agent(provider, tools, context, system_prompt, session=session,
                      sink=sink, limits=Limits(max_turns=spec.max_turns, wall_clock_s=remaining,
                                               max_cost=spec.max_cost, gate=gate),
                      compactor=Compactor(provider, model.context_window, max_output_tokens=model.max_tokens),
                      notices=[] if spec.context_window else [w for w in (
                          None if model.known else unknown_model_warning(model),
                          silent_truncation_warning(model, spec.base_url)) if w])
        # a continued job's conversation so far (already in its session file)
        agent.load_history(earlier, parent.latest_compaction if parent else None)
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
        owner = _owns(still_owner)
        check: Check | None = None
        checked: JobSandbox | None = None
        checking: Future[JobSandbox] | None = None
        try:
            if sandbox and owner and not sandbox.removed_by_pid:
                if spec.check and checks_after(outcome.exit_reason):   # its container starts while the patch is made
                    checking = _create_soon(sandboxes or DockerProvider(), dataclasses.replace(
                        sandbox_config(spec, attempt), image=getattr(sandbox, "image_id", spec.image)))
                # The patch, then the files, from the agent's container, which then goes. The check runs on the
                # patch alone, in a fresh container (worker/check.py): whatever the agent left beside its patch
                # never reaches the verdict, and what the check writes never reaches the patch.
                problem = _collecting(watchdog, sandbox, lambda: _collect_patch(sandbox, spec, job_dir, artifacts))
                budget = FilesBudget(spec.max_files_bytes, spec.max_files)
                missing: list[str] = []
                if spec.files and not sandbox.removed_by_pid:
                    files_problem = _collecting(watchdog, sandbox, lambda: _collect_files(
                        sandbox, spec.files, job_dir, artifacts, budget, missing))
                    problem = problem or files_problem
                sandbox.close()
                if checking is not None and "patch" in artifacts:
                    check, checked = _check(checking, spec, workspace or {}, job_dir, blobs, cancel, sink, watchdog,
                                            snapshot)
                    # A cancel while the check ran: the job's own (it ends cancelled), or its worker stopping or
                    # losing the job (then it is no longer this attempt's to end: it goes back to the queue).
                    owner = _owns(still_owner) if check.cancelled else owner
                    outcome = _after_check(outcome, check)
                    if spec.files and owner and checked is not None and not checked.removed_by_pid:
                        files_problem = _collecting(watchdog, checked, lambda: _collect_check_files(
                            checked, spec, job_dir, artifacts, missing))
                        problem = problem or files_problem
                _refused(artifacts, [{"path": path, "reason": "not found", "artifact": "files"} for path in missing])
                if problem and outcome.status == "completed":
                    outcome = _ended(outcome, "artifact_error", problem)
        finally:
            watchdog.stop()
            if sandbox:
                sandbox.close()
            if checking is not None:   # its sandbox goes, once made (now, or when it is: closing twice is harmless)
                checking.add_done_callback(_close_made)
            if checked:
                checked.close()
            if snapshot is not None:
                if keep is not None:
                    snapshot.keep(StoreBlobs(keep))   # (if the model never answered: now)
                snapshot.close()
        result = build_result(spec, outcome, started, artifacts, workspace,
                              check.to_result() if check is not None else None)
        if getattr(sandbox, "image_id", None):   # the image it ran, by id (a tag may have moved since)
            result["image_id"] = getattr(sandbox, "image_id")
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
        if keep is not None:
            keep_run_artifacts(keep, spec, job_dir, result)
        if owner:
            try:
                write_json_atomic(os.path.join(job_dir, "result.json"), result)
            except OSError:
                if artifact_store is None:
                    raise
                # the store has it: a --out that vanished here (another machine's path) costs only the local copy
        if spool is not None:
            remove_tree(spool)
    return result


def _keeping_once_answered(sink: ev.EventSink, snapshot: DirSnapshot, blobs: Blobs) -> ev.EventSink:
    """The sink, which also starts storing the snapshot once the model's first reply begins: during the wait for
    it, nothing competes with the job's start."""
    def events(event: ev.Event) -> None:
        sink(event)
        if isinstance(event, (ev.TextDelta, ev.ModelRetry)) or (isinstance(event, ev.MessageEnd)
                                                                 and event.message.role == "assistant"):
            snapshot.keep(blobs)
    return events


def _owns(still_owner: Callable[[], bool]) -> bool:
    try:
        return still_owner()
    except Exception:   # the store is unreachable: better no artifacts than overwriting a new owner's
        return False


def _forget(store: JobAttachments, job_id: str, name: str) -> None:
    try:
        store.delete_artifact(job_id, name)
    except Exception:   # a stale copy of this attempt's transcript beside its final one: untidy, never harmful
        pass


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


def _collecting(watchdog: Watchdog, sandbox: JobSandbox, collect: Callable[[], str | None]) -> str | None:
    """One collection under its deadline (past it the container goes, which ends any stuck copy)."""
    watchdog.arm(COLLECT_TIMEOUT_S, sandbox.kill, "collect")
    problem = collect()
    watchdog.disarm()
    if watchdog.fired == "collect":
        return f"collecting the artifacts ran out of time ({COLLECT_TIMEOUT_S:g}s)"
    return problem


def _collect_patch(sandbox: JobSandbox, spec: JobSpec, job_dir: str, artifacts: dict[str, Any]) -> str | None:
    """The patch into `artifacts` (what was refused is listed with its reason). Returns why there is none (then a
    completed job fails), or None."""
    try:
        patch = sandbox.export_patch(os.path.join(job_dir, "patch.diff"), spec.max_patch)
        artifacts["patch"] = "patch.diff"
        _refused(artifacts, [{"path": s.path, "reason": s.reason, "artifact": "patch"} for s in patch.dropped])
        return None
    except Exception as exc:
        artifacts["patch_error"] = f"no patch: {_describe(exc)}"
        return artifacts["patch_error"]


def _collect_files(sandbox: JobSandbox, paths: list[str], job_dir: str, artifacts: dict[str, Any],
                   budget: FilesBudget, missing: list[str] | None) -> str | None:
    """The requested files into `artifacts`, likewise. `missing`: where to list the paths not found (else they
    are refused as such)."""
    try:
        written, skipped = sandbox.export_files(paths, os.path.join(job_dir, "files"), budget)
        artifacts["files"] = artifacts.get("files", []) + written
        if missing is not None:
            missing += [s.path for s in skipped if s.reason == "not found"]
            skipped = [s for s in skipped if s.reason != "not found"]
        _refused(artifacts, [{"path": s.path, "reason": s.reason, "artifact": "files"} for s in skipped])
        return None
    except Exception as exc:
        artifacts["files_error"] = f"files not collected: {_describe(exc)}"
        return artifacts["files_error"]


def _collect_check_files(box: JobSandbox, spec: JobSpec, job_dir: str, artifacts: dict[str, Any],
                         missing: list[str]) -> str | None:
    """After a check, its container's --files win over the agent's: a report at the same path could be the agent's
    forgery. Each path the check's container has replaces the agent's copy (a path inside another is part of it);
    `missing` keeps those neither had. artifacts["files_from"] says which container each file came from."""
    files_dir, staging = os.path.join(job_dir, "files"), os.path.join(job_dir, ".files-check")
    outermost: dict[str, str] = {}   # in-container path, relative to /, -> the --file that names it
    for path in sorted(spec.files, key=lambda p: len(_in_container(box, p))):
        rel = _in_container(box, path)
        if rel and not any(rel == kept or rel.startswith(kept + "/") for kept in outermost):
            outermost[rel] = path
    remove_tree(staging)
    try:
        written, skipped = box.export_files(list(outermost.values()), staging,
                                            FilesBudget(spec.max_files_bytes, spec.max_files))
        replaced = [rel for rel in outermost if os.path.lexists(os.path.join(staging, rel))]
        for rel in replaced:
            target = os.path.join(files_dir, rel)
            if os.path.isdir(target) and not os.path.islink(target):
                remove_tree(target)
            elif os.path.lexists(target):
                os.unlink(target)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(os.path.join(staging, rel), target)
        from_agent = [f for f in artifacts.get("files", []) if not _under(f, files_dir, replaced)]
        from_check = sorted({os.path.join(files_dir, os.path.relpath(f, staging)) for f in written
                             if _under(f, staging, replaced)})
        artifacts["files"] = from_agent + from_check
        artifacts["files_from"] = {"agent": from_agent, "check": from_check}
        found = {outermost[rel] for rel in replaced} | {path for path in spec.files
                                                        if any(_inside_rel(_in_container(box, path), rel)
                                                               for rel in replaced)}
        missing[:] = [path for path in missing if path not in found]
        _refused(artifacts, [{"path": s.path, "reason": s.reason, "artifact": "files"} for s in skipped
                             if s.reason != "not found"])
        return None
    except Exception as exc:
        artifacts["files_error"] = f"files not collected from the check's container: {_describe(exc)}"
        return artifacts["files_error"]
    finally:
        remove_tree(staging)


def _in_container(box: JobSandbox, path: str) -> str:
    """A --file path as the sandbox resolves it, relative to / ("" for / itself)."""
    return posixpath.normpath(posixpath.join(box.workdir, path)).lstrip("/")


def _inside_rel(rel: str, root: str) -> bool:
    return rel == root or rel.startswith(root + "/")


def _under(path: str, root: str, rels: list[str]) -> bool:
    return any(path == os.path.join(root, rel) or path.startswith(os.path.join(root, rel) + os.sep) for rel in rels)


def _refused(artifacts: dict[str, Any], refused: list[dict[str, str]]) -> None:
    if refused:
        artifacts.setdefault("refused", []).extend(refused)


def _close_made(made: "Future[JobSandbox]") -> None:
    if made.exception() is None:
        made.result().close()


def _create_soon(sandboxes: SandboxProvider[Any], config: Any) -> "Future[JobSandbox]":
    """A sandbox made in a thread (the check's, while the agent's patch is collected)."""
    future: Future[JobSandbox] = Future()

    def create() -> None:
        try:
            future.set_result(sandboxes.create(config))
        except BaseException as exc:
            future.set_exception(exc)
    threading.Thread(target=create, name="pid-check-sandbox", daemon=True).start()
    return future


def _check(checking: "Future[JobSandbox]", spec: JobSpec, workspace: dict[str, Any], job_dir: str,
           blobs: Blobs | None, cancel: threading.Event, sink: ev.EventSink, watchdog: Watchdog,
           snapshot: DirSnapshot | None = None) -> tuple[Check, JobSandbox | None]:
    """Run the job's check (worker/check.py) on its patch, in the fresh sandbox `checking` makes (returned: the
    caller closes it), under a deadline of its own: exec kills it in the container at its timeout; should that kill
    itself hang, or the set-up before it, the watchdog removes the container a grace period later."""
    assert spec.check is not None
    sink(ev.CheckStart(spec.check))
    original = tuple(spec.check_original)
    started = time.monotonic()
    box: JobSandbox | None = None
    try:
        try:
            box = checking.result(timeout=CHECK_START_TIMEOUT_S)
        except FutureTimeout:
            raise SandboxError(f"the check's sandbox did not start within {CHECK_START_TIMEOUT_S:g}s") from None
        watchdog.arm(COLLECT_TIMEOUT_S + spec.check_timeout_s + GRACE_S, box.kill, "check")
        _original_workspace(box, spec, workspace, blobs, snapshot)
        with open(os.path.join(job_dir, "patch.diff"), "rb") as f:
            apply_patch(box, f.read(), original, whose="the job's patch")
        if cancel.is_set():
            check = Check(spec.check, None, False, 0.0, "", cancelled=True)
        else:
            check = run_check(box, spec.check, spec.check_timeout_s, cancel)
    except Exception as exc:
        took = round(time.monotonic() - started, 3)
        if watchdog.fired == "check":
            check = Check(spec.check, None, False, took, "", timed_out=True,
                          error=f"the check did not end within {spec.check_timeout_s:g}s; the sandbox was removed")
        else:
            check = Check(spec.check, None, False, took, "", error=_describe(exc))
    finally:
        watchdog.disarm()
    check = dataclasses.replace(check, original=original)
    sink(ev.CheckEnd(check.to_result()))
    return check, box


def _original_workspace(box: JobSandbox, spec: JobSpec, workspace: dict[str, Any], blobs: Blobs | None,
                        snapshot: DirSnapshot | None) -> None:
    """The workspace the agent started from, into the check's sandbox: the image's own directory is there already;
    the same snapshot (a directory's, `pid run`, as the job saw it), or the same commit."""
    if workspace.get("kind") == "image":
        return
    if workspace.get("kind") == "git":
        import_into(box, f"{workspace['url']}#{workspace['commit']}", None)
    else:
        import_into(box, spec.repo, spec.workspace, blobs, snapshot=snapshot)


def _after_check(outcome: Outcome, check: Check) -> Outcome:
    """The ending, once the check ran. A check that ran keeps the reason (its verdict is the exit code's business:
    pid.endings.exit_code_of); a cancel while it ran cancels the job; a check the sandbox could not run fails a
    completed job (the sandbox failed: nothing was checked)."""
    if check.cancelled:
        return _ended(outcome, "cancelled", "cancelled while the check ran")
    if check.error and not check.timed_out and outcome.status == "completed":
        return _ended(outcome, "sandbox_error", f"the check could not run: {check.error}")
    return outcome


def _provider_label(spec: JobSpec) -> str:
    return "anthropic" if spec.api.startswith("anthropic") else "openai"


def _is_sandbox_error(exc: BaseException) -> bool:
    return isinstance(exc, (SandboxError, docker.errors.DockerException))


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500] if len(text) > 500 else text
