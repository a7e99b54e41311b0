"""Jobs made from other jobs: `pid retry` (the same spec again) and `pid continue` (the conversation goes on).

A continued job runs on its parent's snapshot (the same workspace blob, or the same git commit) with the parent's
patch applied inside the container (git apply as the agent's user: never git on the host), so its own patch, made
against that same snapshot, is the whole change. Its transcript starts as a copy of the parent's (a new session file
whose header names the parent's, as pi's fork writes it); the new message follows, and the loop runs on.

Everything comes from the job store, so both work from any machine that shares it. The client side (the specs) is
light: no agent, provider or sandbox code is imported for it.
"""
from __future__ import annotations

import dataclasses
import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Any

from pid.endings import BEFORE_THE_AGENT
from pid.jobs.spec import DIGEST_RE, JobSpec, new_job_id
from pid.jobs.store import ARTIFACT_LIMIT, BlobMissing, JobAttachments, JobRecords, Store

SESSION = "session.jsonl"
PATCH = "patch.diff"
RESULT = "result.json"
PATCH_IN_SANDBOX = "/tmp/.pid-parent.patch"
APPLY_TIMEOUT_S = 600.0


class Refused(Exception):
    """The job cannot be made from that one: one line for the user."""


# -- the client's side: the new job's spec ------------------------------------------------------------------------

def retry_spec(store: Store, job_id: str) -> JobSpec:
    """The job's spec again, under a new id: the same task on the same snapshot (a git URL pinned to the commit the
    job ran on, when it ran). A retried continuation continues the same parent again."""
    record = _record(store, job_id)
    if not record.terminal:   # a second run beside a live one: never (docs/jobs.md: Continue and retry)
        raise Refused(f"job {job_id} is {record.status}: only a job that has ended can be retried "
                      f"(pid result {job_id} --wait waits for it; pid cancel {job_id} ends it)")
    if record.spec.parent:
        _continuable(store, record.spec.parent)
    spec = _copy(record.spec, store, job_id)
    spec.retry_of = job_id
    return spec


def continuation_spec(store: Store, job_id: str, message: str) -> JobSpec:
    """A new job that continues `job_id` (which must have ended, with its transcript and patch in the store) with
    `message` as the next user message."""
    record = _continuable(store, job_id)
    spec = _copy(record.spec, store, job_id)
    spec.task, spec.parent, spec.retry_of = message, job_id, None
    return spec


# What describes one model rather than the job: a different model starts from the model table's values (0 and None
# are "the table's"), never from the earlier model's prices or window.
MODEL_FIELDS = ("input_price", "output_price", "cache_read_price", "cache_write_price", "context_window",
                "max_tokens")


def switch_model(spec: JobSpec, model: str | None = None, base_url: str | None = None,
                 api: str | None = None) -> None:
    """Let another model (or endpoint, or wire format) carry on. Without a base URL the earlier job's stays, unless
    it was its wire format's own endpoint and the format changes: then the new format's own is used."""
    from pid.config import DEFAULT_BASE_URLS, base_url_for
    if model and model != spec.model:
        defaults = JobSpec(task="-", model="-")
        for name in MODEL_FIELDS:
            setattr(spec, name, getattr(defaults, name))
        spec.model = model
    if api and api != spec.api:
        if not base_url and (spec.base_url or "").rstrip("/") == DEFAULT_BASE_URLS[spec.api].rstrip("/"):
            spec.base_url = None
        spec.api = api
    if base_url:
        spec.base_url = base_url
    spec.base_url = base_url_for(spec.api, spec.base_url)   # the spec records the endpoint the job really uses


def _continuable(store: Store, job_id: str) -> Any:
    """The job's record, if it can be continued: it has ended, and its transcript and patch are in the store."""
    record = _record(store, job_id)
    if not record.terminal:
        raise Refused(f"job {job_id} is {record.status}: only a job that has ended can be continued "
                      f"(pid result {job_id} --wait waits for it; pid follow-up talks to a running one)")
    if record.attempts == 0:
        raise Refused(f"job {job_id} ended ({record.status}) before it ran: it has no conversation to continue")
    names = set(store.artifact_names(job_id))
    missing = [name for name in (RESULT, SESSION, PATCH) if name not in names]
    if missing and record.exit_reason == "client_lost":
        raise Refused(f"job {job_id} ended client_lost: its `pid run` process was killed before it could keep the "
                      f"conversation, so there is none to continue (pid retry {job_id} runs its task again from the "
                      "start)")
    ran = record.turns or any(attempt.get("turns") for attempt in record.earlier)   # (turns: the last attempt's)
    if SESSION in missing and not ran and record.exit_reason in BEFORE_THE_AGENT:
        raise Refused(f"job {job_id} ended ({record.status}: {record.exit_reason}) before its agent started: it has "
                      f"no conversation to continue (pid status {job_id} says why)")
    if missing:
        why = "expired after the retention period, or the job ended without them"
        raise Refused(f"job {job_id} has no {' or '.join(missing)} in the job store ({why}): it cannot be continued")
    return record


def _record(store: JobRecords, job_id: str) -> Any:
    record = store.get(job_id)
    if record is None:
        raise Refused(f"no such job: {job_id}")
    return record


def _copy(spec: JobSpec, store: Store, job_id: str) -> JobSpec:
    """The spec under a new id, on the very snapshot the job had."""
    # not in the earlier job's batch: that batch's ledger never names it, and its spent budget would end it at once
    new = dataclasses.replace(spec, id=new_job_id(), files=list(spec.files),
                              tools=list(spec.tools) if spec.tools else spec.tools, batch=None)
    ran = _result(store, job_id)
    if isinstance(ran.get("image_id"), str) and DIGEST_RE.fullmatch(ran["image_id"]):
        new.image_id = ran["image_id"]   # the image it ran, not the one its tag names now
    if spec.workspace:
        if not store.has_blob(spec.workspace):
            raise Refused(f"job {job_id}: its workspace snapshot ({spec.workspace[:19]}…) is no longer in the job "
                          "store (expired after the retention period)")
        return new
    if not spec.repo:   # the image's own workdir: the image is the snapshot
        return new
    from pid.jobs.snapshot import git_source
    git = git_source(spec.repo) if "://" in spec.repo else None
    workspace = ran.get("workspace")
    ran_on = workspace if isinstance(workspace, dict) else {}
    if git is not None:
        if ran_on.get("kind") == "git" and ran_on.get("commit"):
            new.repo = f"{git.url}#{ran_on['commit']}"
        return new
    # `pid run`: its directory, packed as the job saw it, kept as a blob (jobs/snapshot.py DirSnapshot)
    digest = ran_on.get("digest") if ran_on.get("kind") == "dir" else None
    if not isinstance(digest, str) or not digest.startswith("sha256:"):
        raise Refused(f"job {job_id} read its directory {spec.repo} when it started (`pid run`), and the job store "
                      "has no snapshot of it to run on again")
    if not store.has_blob(digest):
        raise Refused(f"job {job_id}: its workspace snapshot ({digest[:19]}…) is not in the job store (expired "
                      "after the retention period, or it could not be stored)")
    new.workspace = digest
    return new


def pinned_image_gone(spec: JobSpec, where: str) -> str:
    """What to say when the image a retry or continuation pins (image_id) is not there (`where`: "is not in …")."""
    return (f"the image the earlier job ran ({str(spec.image_id)[:19]}…, then {spec.image}) {where}: a "
            "retry or continuation runs on that very image, not on what its tag names now (an image has the same id "
            "on every machine only when it comes from one registry or file)")


def _result(store: Store, job_id: str) -> dict[str, Any]:
    """The job's result.json, for what it ran on: its `workspace` (which snapshot) and `image_id` ({} when unknown)."""
    from pid.jobs.artifact_store import read_result
    try:
        result = read_result(store, job_id) or {}
    except Exception:
        return {}
    return result if isinstance(result, dict) else {}



# -- the worker's side: the parent's state into the new job -------------------------------------------------------

@dataclass
class Parent:
    id: str
    session_path: str               # where the parent's transcript is, for the header's parentSession
    entries: list[dict[str, Any]]   # the parent session's entries along its current branch, oldest first
    patch: bytes

    @property
    def latest_compaction(self) -> dict[str, Any] | None:
        """The latest compaction entry on the parent's branch: the conversation loaded opens with its summary."""
        return next((e for e in reversed(self.entries) if e.get("type") == "compaction"), None)


def load_parent(store: Store, parent_id: str, tmp_dir: str) -> tuple[Parent, list[Any]]:
    """The parent's transcript and patch from the store, and its conversation as (entry id, message) pairs, as
    pid.session.session_context_entries builds them (after a compaction: its summary, then the kept messages).
    Raises Refused when they are gone or unreadable."""
    import os
    import tempfile
    from pid.session import session_context_entries
    parent = _record(store, parent_id).spec
    data = {name: _artifact(store, parent.id, name) for name in (SESSION, PATCH)}
    fd, path = tempfile.mkstemp(prefix=".pid-parent-session-", suffix=".jsonl", dir=tmp_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data[SESSION])
        try:
            messages = session_context_entries(path)
            entries = session_chain(data[SESSION].decode("utf-8"))
        except (ValueError, KeyError, TypeError) as exc:
            raise Refused(f"the transcript of job {parent.id} cannot be read: {exc}") from None
    finally:
        os.unlink(path)
    return Parent(parent.id, os.path.join(parent.job_dir, SESSION), entries, data[PATCH]), messages


def session_chain(text: str) -> list[dict[str, Any]]:
    """The entries from the root to the session's leaf, skipping the header (pid.session.read_chain)."""
    from pid.session import read_chain
    return read_chain(text.splitlines())[1]


def _artifact(store: JobAttachments, job_id: str, name: str) -> bytes:
    try:
        data = bytearray()
        for chunk in store.open_artifact(job_id, name):
            data += chunk
            if len(data) > ARTIFACT_LIMIT:
                raise Refused(f"the {name} of job {job_id} is larger than {ARTIFACT_LIMIT} bytes")
        return bytes(data)
    except BlobMissing:
        raise Refused(f"the {name} of job {job_id} is no longer in the job store (expired?)") from None


def apply_patch(sandbox: Any, patch: bytes, exclude: list[str] | tuple[str, ...] = (),
                whose: str = "the parent job's patch") -> None:
    """A patch onto the freshly imported workspace, by git apply inside the sandbox, as the agent's user (the files
    stay the agent's). The base the new patch is made against stays the snapshot. Run from / on paths under the
    workspace, so no repository of the workspace (its config, its hooks) has any say. `exclude`: workspace paths
    (a file, or a directory and all below it) whose changes are left out: they stay as the snapshot has them."""
    if not patch.strip():
        return
    sandbox.write_file(PATCH_IN_SANDBOX, patch)
    where = sandbox.workdir.strip("/")
    skip = "".join(f" --exclude={shlex.quote(pattern)}" for path in exclude
                   for pattern in _excluded(posixpath.join(where, path.strip("/"))))
    skip += "".join(f" --exclude={shlex.quote(pattern)}" for pattern in BYTECODE)   # (never in pid's patches)
    command = ("cd / && env -u GIT_DIR -u GIT_WORK_TREE GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null "
               f"git apply --binary --whitespace=nowarn --directory={shlex.quote(where)}{skip} {PATCH_IN_SANDBOX}; "
               f"status=$?; rm -f {PATCH_IN_SANDBOX}; exit $status")
    done = sandbox.exec(command, timeout=APPLY_TIMEOUT_S)
    if done.exit_code != 0:
        tail = done.tail.decode("utf-8", errors="replace").strip().splitlines()
        raise Refused(f"{whose} does not apply to its snapshot: "
                      + (tail[-1][:300] if tail else f"git apply exited {done.exit_code}"))


BYTECODE = ("*.py[cod]", "__pycache__/*", "*/__pycache__/*")   # git apply's wildmatch: `*` crosses slashes


def _excluded(path: str) -> list[str]:
    """git apply --exclude patterns (wildmatch, `*` crossing slashes) for a path and everything below it."""
    literal = re.sub(r"([*?\\[\]])", r"\\\1", path)
    return [literal, literal + "/*"]


def start_session(writer: Any, parent: Parent) -> None:
    """The parent's entries, as they were, at the top of the new session file."""
    for entry in parent.entries:
        writer.copy(entry)

