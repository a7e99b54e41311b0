"""The job's --check, part of collecting its results: run on the agent's patch alone, in a fresh sandbox (started
while the agent's patch is made), under a deadline of its own; then its container's --files win over the agent's.

Whatever the agent left beside its patch never reaches the verdict, and what the check writes never reaches the
patch (worker/check.py runs the command itself).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable

from pid import events as ev
from pid.agent import Outcome
from pid.sandbox.config import container_path
from pid.sandbox_api import SandboxError
from pid.sandbox_lifecycle import FilesBudget, JobSandbox, SandboxProvider
from pid.worker.check import Check, run_check
from pid.jobs.continuation import Refused, apply_patch
from pid.worker.job_run import JobRun, describe, ended, owns, refused
from pid.jobs.spec import JobSpec
from pid.worker.sandbox_start import COLLECT_TIMEOUT_S, GRACE_S, sandbox_config
from pid.jobs.snapshot import import_into
from pid.jobs.trees import remove_tree

log = logging.getLogger("pid.worker")

CHECK_START_TIMEOUT_S = 300.0   # the check's fresh sandbox must be up by then (else the check could not run)
PROBE_TIMEOUT_S = 30.0          # to look for the --check-original paths in it

Collecting = Callable[[JobSandbox, Callable[[], "str | None"]], "str | None"]   # one collection under its deadline


def start_check_sandbox(job: JobRun) -> None:
    """The check's sandbox starts (job.checking), from the image the agent's ran (by id: a tag may have moved)."""
    assert job.sandbox is not None
    job.checking = _create_soon(job.sandboxes, dataclasses.replace(
        sandbox_config(job.spec, job.attempt), image=getattr(job.sandbox, "image_id", job.spec.image)))


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


def check_patch(job: JobRun, owner: bool, still_owner: Callable[[], bool], missing: list[str],
                collecting: Collecting) -> tuple[bool, str | None]:
    """Run the check on the job's patch; its ending follows. (Whether this worker still owns the job, why the check's
    files could not be collected or None.)"""
    assert job.checking is not None
    job.check, job.checked = _check(job)
    # Asked again after the check, however it went: a cancel while it ran is the job's own (it ends cancelled) or its
    # worker's stopping or losing the job (then it is no longer this attempt's to end: it goes back to the queue),
    # and a check that outlasted a stopping worker's grace leaves the job to be handed back, its files uncollected.
    owner = owner and owns(still_owner)
    job.outcome = _after_check(job.outcome, job.check)
    checked, spec = job.checked, job.spec
    if spec.files and owner and checked is not None and not checked.removed_by_pid:
        return owner, collecting(checked, lambda: _collect_check_files(checked, spec, job.job_dir, job.artifacts,
                                                                        missing))
    return owner, None


def _check(job: JobRun) -> tuple[Check, JobSandbox | None]:
    """Run the job's check (worker/check.py) on its patch, in the fresh sandbox `checking` makes (returned: the
    caller closes it), under a deadline of its own: exec kills it in the container at its timeout; should that kill
    itself hang, or the set-up before it, the watchdog removes the container a grace period later."""
    spec, watchdog = job.spec, job.watchdog
    assert spec.check is not None and job.checking is not None
    job.sink(ev.CheckStart(spec.check))
    original = tuple(spec.check_original)
    missing: tuple[str, ...] = ()
    started = time.monotonic()
    box: JobSandbox | None = None
    try:
        box = _check_box(job)
        if box is None:   # cancelled while its sandbox was being made
            return _ended_check(job, Check(spec.check, None, False, 0.0, "", cancelled=True), original, missing), box
        watchdog.arm(COLLECT_TIMEOUT_S + spec.check_timeout_s + GRACE_S, box.kill, "check")
        _original_workspace(box, job)
        missing = _not_in_original(box, original)
        with open(os.path.join(job.job_dir, "patch.diff"), "rb") as f:
            patch = f.read()
        try:
            apply_patch(box, patch, original, whose="the job's patch")
        except Refused as exc:   # the patch's fault, not the sandbox's: nothing was checked
            check = Check(spec.check, None, False, round(time.monotonic() - started, 3), "", error=str(exc),
                          unapplied=True)
        else:
            if job.cancel.is_set():
                check = Check(spec.check, None, False, 0.0, "", cancelled=True)
            else:
                check = run_check(box, spec.check, spec.check_timeout_s, job.cancel)
    except Exception as exc:
        took = round(time.monotonic() - started, 3)
        if watchdog.fired == "check":
            check = Check(spec.check, None, False, took, "", timed_out=True,
                          error=f"the check did not end within {spec.check_timeout_s:g}s; the sandbox was removed")
        else:
            check = Check(spec.check, None, False, took, "", error=describe(exc))
    finally:
        watchdog.disarm()
    return _ended_check(job, check, original, missing), box


def _ended_check(job: JobRun, check: Check, original: tuple[str, ...], missing: tuple[str, ...]) -> Check:
    check = dataclasses.replace(check, original=original, original_missing=missing)
    job.sink(ev.CheckEnd(check.to_result()))
    return check


def _check_box(job: JobRun) -> JobSandbox | None:
    """The check's sandbox once it is made; None if the job is cancelled first (a stopping worker's grace may end
    while it starts)."""
    assert job.checking is not None
    deadline = time.monotonic() + CHECK_START_TIMEOUT_S
    while True:
        try:
            return job.checking.result(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
        except FutureTimeout:
            if job.cancel.is_set():
                return None
            if time.monotonic() >= deadline:
                raise SandboxError(f"the check's sandbox did not start within {CHECK_START_TIMEOUT_S:g}s") from None


def _original_workspace(box: JobSandbox, job: JobRun) -> None:
    """The workspace the agent started from, into the check's sandbox: the image's own directory is there already;
    the same snapshot (a directory's, `pid run`, as the job saw it), or the same commit."""
    workspace = job.workspace or {}
    if workspace.get("kind") == "image":
        return
    if workspace.get("kind") == "git":
        import_into(box, f"{workspace['url']}#{workspace['commit']}", None)
    else:
        import_into(box, job.spec.repo, job.spec.workspace, job.blobs, snapshot=job.snapshot)


def _not_in_original(box: JobSandbox, original: tuple[str, ...]) -> tuple[str, ...]:
    """The --check-original paths the original workspace does not have: the check sees them absent (what the agent
    made there is left out), which a misspelt path protects nothing by; result.json says so. Asked of the check's
    fresh sandbox, before the patch: nothing of the agent's is there yet."""
    if not original:
        return ()
    names = " ".join(shlex.quote(path) for path in original)
    try:
        done = box.exec(f"i=0; for p in {names}; do [ -e \"$p\" ] || [ -L \"$p\" ] || echo pid-missing:$i; "
                        "i=$((i + 1)); done", timeout=PROBE_TIMEOUT_S)
    except (SandboxError, OSError) as exc:   # only a warning hangs on it: the check itself goes on (or fails) alone
        log.warning("looking for the --check-original paths: %s", exc)
        return ()
    if done.exit_code != 0:
        log.warning("looking for the --check-original paths: exit %s", done.exit_code)
        return ()
    found = [word.split(b":", 1)[1] for word in done.tail.split() if word.startswith(b"pid-missing:")]
    return tuple(original[int(i)] for i in found if i.isdigit() and int(i) < len(original))


def _after_check(outcome: Outcome, check: Check) -> Outcome:
    """The ending, once the check ran. A check that ran keeps the reason (its verdict is the exit code's business:
    pid.endings.exit_code_of); a cancel while it ran cancels the job; a check the sandbox could not run fails a
    completed job (the sandbox failed: nothing was checked)."""
    if check.cancelled:
        return ended(outcome, "cancelled", "cancelled while the check ran")
    if check.unapplied and outcome.status == "completed":
        return ended(outcome, "artifact_error", f"the check could not judge the patch: {check.error}")
    if check.error and not check.timed_out and outcome.status == "completed":
        return ended(outcome, "sandbox_error", f"the check could not run: {check.error}")
    return outcome


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
        refused(artifacts, [{"path": s.path, "reason": s.reason, "artifact": "files"} for s in skipped
                            if s.reason != "not found"])
        return None
    except Exception as exc:
        artifacts["files_error"] = f"files not collected from the check's container: {describe(exc)}"
        return artifacts["files_error"]
    finally:
        remove_tree(staging)


def _in_container(box: JobSandbox, path: str) -> str:
    """A --file path as the sandbox resolves it, relative to / ("" for / itself)."""
    return container_path(path, box.workdir).lstrip("/")


def _inside_rel(rel: str, root: str) -> bool:
    return rel == root or rel.startswith(root + "/")


def _under(path: str, root: str, rels: list[str]) -> bool:
    return any(path == os.path.join(root, rel) or path.startswith(os.path.join(root, rel) + os.sep) for rel in rels)

