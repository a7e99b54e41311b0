"""A job's last phase: result.json, made and written where it belongs.

    the result (status, ending, usage, artifacts, check) -> the store's copy of the artifacts (a worker's job) ->
    what `retry` and `continue` need (a `pid run` job's store) -> result.json in the job's directory (an owner's
    only) -> the spool directory removed

result.json's status is true: a job whose sandbox died or whose artifacts could not be made is never `completed`.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from pid.agent import Outcome
from pid.jobs.results import build_result
from pid.jobs.artifact_store import SESSION, keep_run_artifacts, store_result, upload_artifacts, upload_transcript
from pid.worker.job_run import JobRun
from pid.jobs.spec import JobSpec, write_json_atomic
from pid.jobs.store import Store
from pid.jobs.trees import remove_tree

def record(job: JobRun, *, owner: bool, spool: str | None, amend_result: Callable[[dict[str, Any]], None] | None,
           artifact_store: Store | None, keep: Store | None) -> dict[str, Any]:
    """result.json's content, stored and written (see run_job for where); returned."""
    spec = job.spec
    result = build_result(spec, job.outcome, job.started, job.artifacts, job.workspace,
                          job.check.to_result() if job.check else None)
    if getattr(job.sandbox, "image_id", None):   # the image it ran, by id (a tag may have moved since)
        result["image_id"] = getattr(job.sandbox, "image_id")
    result["attempt"] = job.attempt   # whose result this is: a sweep elsewhere trusts a stored one of this attempt
    _files_relative(result.get("artifacts") or {}, job.job_dir)
    if amend_result:
        amend_result(result)
    if job.syncing is not None:
        job.syncing.stop()
    if artifact_store is not None:
        if owner:
            upload_artifacts(artifact_store, spec, job.job_dir, result)
            refused = {r.get("name") for r in (result.get("artifacts") or {}).get("not_stored") or []}
            # session.jsonl is this attempt's transcript: its copy goes (refused, the copy is the most of it the
            # store can have, and stays; no sync started, there is no copy)
            if job.syncing is not None and SESSION not in refused:
                job.syncing.discard()
        else:   # handed back or taken over: this attempt's transcript is kept all the same
            digest = upload_transcript(artifact_store, spec.id, job.job_dir, job.attempt)
            if job.syncing is not None and digest is not None:
                job.syncing.stored(digest)
    if keep is not None:
        keep_run_artifacts(keep, spec, job.job_dir, result)
    if owner:
        try:
            write_json_atomic(os.path.join(job.job_dir, "result.json"), result)
        except OSError:
            if artifact_store is None:
                raise
            # the store has it: a --out that vanished here (another machine's path) costs only the local copy
    if spool is not None:
        remove_tree(spool)
    return result


def _files_relative(artifacts: dict[str, Any], job_dir: str) -> None:
    """The collected files by their path in the job's directory (files/…), as the digests name them: the worker's
    own path is wrong wherever the directory is downloaded to (a batch's item folder, `pid result --download`)."""
    def relative(paths: Any) -> Any:
        return [os.path.relpath(p, job_dir) if isinstance(p, str) and os.path.isabs(p) else p for p in paths] \
            if isinstance(paths, list) else paths
    if "files" in artifacts:
        artifacts["files"] = relative(artifacts["files"])
    if isinstance(artifacts.get("files_from"), dict):
        artifacts["files_from"] = {k: relative(v) for k, v in artifacts["files_from"].items()}


def record_unstarted(spec: JobSpec, error: str, started: float, artifact_store: Store | None) -> dict[str, Any]:
    """The result of a job that could not even start (it has no directory to work in): stored, not written."""
    failed = build_result(spec, Outcome("error", error=error), started, {})
    if artifact_store is not None:
        store_result(artifact_store, spec.id, failed)
    return failed
