"""What a job's phases share (worker/runner.py runs them: prepare, run the agent, collect, record), and the small
rules of an ending they all apply.

A `JobRun` is filled in as the job goes: set-up opens the sandbox, the workspace's stream and snapshot, the session;
collection adds the artifacts and the check. `release` is the one step that runs whatever happened: the sandboxes
go.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable

from pid import events as ev
from pid.agent import Outcome
from pid.endings import ExitReason
from pid.messages import Usage
from pid.providers.base import Provider
from pid.sandbox_lifecycle import JobSandbox, SandboxProvider
from pid.session import SessionWriter
from pid.jobs.artifact_store import TranscriptSync
from pid.jobs.blobs import Blobs, StoreBlobs
from pid.worker.check import Check
from pid.jobs.spec import JobSpec
from pid.jobs.snapshot import DirSnapshot
from pid.jobs.store import Store
from pid.worker.watchdog import Watchdog


CHECK_MADE_WAIT_S = 60.0   # the most a job's end waits for its check's sandbox to be made, to remove it


@dataclass
class JobRun:
    """One run of a job, from its directory on: where it comes from, what it holds open, how it has ended so far."""
    spec: JobSpec
    job_dir: str
    started: float   # time.time() when run_job began (result.json's started_at)
    attempt: int
    cancel: threading.Event
    sandboxes: SandboxProvider[Any]   # makes the job's sandbox (unless it was started early) and the check's
    blobs: Blobs | None
    sink: ev.EventSink
    starting: "Future[JobSandbox] | None" = None   # the sandbox started early, until set-up takes it
    watchdog: Watchdog = field(default_factory=Watchdog)
    outcome: Outcome = field(default_factory=lambda: Outcome("error", usage=Usage()))
    artifacts: dict[str, Any] = field(default_factory=dict)
    workspace: dict[str, Any] | None = None   # which snapshot the job runs on, once imported
    sandbox: JobSandbox | None = None
    packed: BinaryIO | None = None   # the packed workspace's stream from the blob store, once opened
    snapshot: DirSnapshot | None = None   # a directory repo (`pid run`), as the job saw it
    provider: Provider | None = None
    session: SessionWriter | None = None
    syncing: TranscriptSync | None = None
    check: Check | None = None
    checking: "Future[JobSandbox] | None" = None   # the check's sandbox, being made
    checked: JobSandbox | None = None   # the check's sandbox, once it ran
    earlier: list[dict[str, Any]] = field(default_factory=list)   # the job's earlier attempts' counts (Limits)
    begun: float = field(default_factory=time.monotonic)   # its wall clock's start (a clock step changes no limit)

    def elapsed(self) -> float:
        """Seconds since run_job began, as --timeout counts them."""
        return time.monotonic() - self.begun

    def release(self, keep: Store | None) -> None:
        """The job's sandboxes are removed (the check's too, once made: now, or when it is), its watchdog stops, and
        a directory's snapshot is kept for `retry`/`continue` (if the model never answered: now), then closed."""
        self.watchdog.stop()
        if self.sandbox:
            self.sandbox.close()
        try:
            if self.checking is not None:
                self._close_check_sandbox()
        finally:
            if self.checked:
                self.checked.close()
            if self.snapshot is not None:
                if keep is not None:
                    self.snapshot.keep(StoreBlobs(keep))
                self.snapshot.close()

    def _close_check_sandbox(self) -> None:
        """Waited for, not left to a callback: a process that ends next (`pid run`) would stop the thread making it,
        and leave a running container behind (a check that never ran: the patch could not be made). Closing twice is
        harmless."""
        assert self.checking is not None
        try:
            made = self.checking.result(timeout=CHECK_MADE_WAIT_S)
        except BaseException as exc:   # not made; or still being made (its time to live and the reaper end it)
            self.checking.add_done_callback(_close_made)
            if not isinstance(exc, Exception):
                raise
        else:
            made.close()


def _close_made(made: "Future[JobSandbox]") -> None:
    if made.exception() is None:
        made.result().close()


def ended(outcome: Outcome, reason: ExitReason, error: str) -> Outcome:
    """The same run, with the ending that is true of it."""
    return dataclasses.replace(outcome, exit_reason=reason, error=outcome.error or error)


def owns(still_owner: Callable[[], bool]) -> bool:
    """Whether this worker still owns the job (else it must not write over the new owner's patch and result)."""
    try:
        return still_owner()
    except Exception:   # the store is unreachable: better no artifacts than overwriting a new owner's
        return False


def describe(exc: BaseException) -> str:
    """An exception in one readable line (result.json's error)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500] if len(text) > 500 else text


def refused(artifacts: dict[str, Any], entries: list[dict[str, str]]) -> None:
    """What was refused on the way out, listed with its reason (artifacts["refused"])."""
    if entries:
        artifacts.setdefault("refused", []).extend(entries)
