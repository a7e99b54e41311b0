"""A job's third phase, once the agent stopped (or set-up failed): what it leaves, and the ending that is true of it.

    set-up's leftovers closed, the transcript ended -> the ending checked (a wall clock that ran out, a sandbox
    gone) -> the patch, then the --files, from the agent's container, which then goes -> the --check on the patch
    (worker/job_check.py) -> a completed job whose artifacts could not be made fails (artifact_error)

Every collection runs under its own deadline: past it the container is removed, which ends any stuck copy.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from pid.agent import Outcome
from pid.endings import checks_after
from pid.sandbox_lifecycle import FilesBudget, JobSandbox
from pid.worker.job_check import check_patch, start_check_sandbox
from pid.worker.job_run import JobRun, describe, ended, owns, refused
from pid.jobs.spec import JobSpec
from pid.worker.sandbox_start import COLLECT_TIMEOUT_S


def collect(job: JobRun, still_owner: Callable[[], bool]) -> bool:
    """The job's artifacts into its directory (job.artifacts lists them), its ending made true (job.outcome).
    Returns whether this worker still owns the job: only an owner's artifacts are collected and recorded."""
    end_setup(job)
    job.outcome = true_ending(job)
    owner = owns(still_owner)
    sandbox = job.sandbox
    if not (sandbox and owner and not sandbox.removed_by_pid):
        return owner
    spec = job.spec
    if spec.check and checks_after(job.outcome.exit_reason):   # its container starts while the patch is made
        start_check_sandbox(job)
    problem = _collecting(job, sandbox, lambda: _collect_patch(sandbox, spec, job.job_dir, job.artifacts))
    missing: list[str] = []
    if spec.files and not sandbox.removed_by_pid:
        budget = FilesBudget(spec.max_files_bytes, spec.max_files)
        files_problem = _collecting(job, sandbox, lambda: _collect_files(
            sandbox, spec.files, job.job_dir, job.artifacts, budget, missing))
        problem = problem or files_problem
    sandbox.close()
    if job.checking is not None and "patch" in job.artifacts:
        owner, files_problem = check_patch(job, owner, still_owner, missing,
                                           lambda box, collect_one: _collecting(job, box, collect_one))
        problem = problem or files_problem
    refused(job.artifacts, [{"path": path, "reason": "not found", "artifact": "files"} for path in missing])
    if problem and job.outcome.status == "completed":
        job.outcome = ended(job.outcome, "artifact_error", problem)
    return owner


def end_setup(job: JobRun) -> None:
    """What set-up opened and the agent no longer needs is closed; the transcript ends (an artifact from now on).
    An early sandbox that set-up never took is taken now: it is the job's, to collect from and to remove."""
    if job.packed is not None:
        job.packed.close()
    if job.starting is not None:   # set-up failed before the early sandbox was taken: it goes too
        try:
            job.sandbox = job.starting.result()
        except BaseException:
            pass
    job.watchdog.disarm()
    if job.provider is not None:
        job.provider.close()
    if job.session:
        job.session.close()
        job.artifacts["session"] = "session.jsonl"


def true_ending(job: JobRun) -> Outcome:
    """The agent's ending, unless the wall clock ran out with something still stuck past the grace period (the
    watchdog removed the sandbox), or a completed job's sandbox is gone."""
    if job.watchdog.fired:
        return ended(job.outcome, "wall_clock",
                     f"wall-clock limit of {job.spec.timeout_s:g}s (--timeout) reached; the sandbox was removed")
    if job.sandbox and job.outcome.status == "completed" and not job.sandbox.is_alive():
        return ended(job.outcome, "sandbox_error", "the sandbox container is gone")
    return job.outcome


def _collecting(job: JobRun, sandbox: JobSandbox, collect_one: Callable[[], str | None]) -> str | None:
    """One collection under its deadline (past it the container goes, which ends any stuck copy)."""
    job.watchdog.arm(COLLECT_TIMEOUT_S, sandbox.kill, "collect")
    problem = collect_one()
    job.watchdog.disarm()
    if job.watchdog.fired == "collect":
        return f"collecting the artifacts ran out of time ({COLLECT_TIMEOUT_S:g}s)"
    return problem


def _collect_patch(sandbox: JobSandbox, spec: JobSpec, job_dir: str, artifacts: dict[str, Any]) -> str | None:
    """The patch into `artifacts` (what was refused is listed with its reason). Returns why there is none (then a
    completed job fails), or None."""
    try:
        patch = sandbox.export_patch(os.path.join(job_dir, "patch.diff"), spec.max_patch)
        artifacts["patch"] = "patch.diff"
        refused(artifacts, [{"path": s.path, "reason": s.reason, "artifact": "patch"} for s in patch.dropped])
        return None
    except Exception as exc:
        artifacts["patch_error"] = f"no patch: {describe(exc)}"
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
        refused(artifacts, [{"path": s.path, "reason": s.reason, "artifact": "files"} for s in skipped])
        return None
    except Exception as exc:
        artifacts["files_error"] = f"files not collected: {describe(exc)}"
        return artifacts["files_error"]
