"""How a job can end: one table from exit reason to status and exit code. Everything else derives from it.

Code that ends a job names only the reason; the status and the CLI's exit code are looked up here, so they cannot
disagree between the loop, the runner, the worker, the store and the CLI.

A job with a check (`--check CMD`) has one more input: whether its check passed. The check never changes the
reason nor the status (they say how the agent's run ended: a `completed` job whose check failed is still
`completed`, with `check.passed` false); it changes only the exit code, through `exit_code_of`: a completed job
whose check did not pass exits 4, so that `submit --wait --check CMD` exits 0 only when the agent completed AND the
check passed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

Status = Literal["completed", "failed", "limit", "cancelled"]
ExitReason = Literal[
    "stop",                   # the model answered without calling a tool
    "length",                 # the model's last answer was cut at its output-token limit (finish_reason length)
    "wall_clock",             # --timeout reached
    "max_turns",              # --max-turns reached
    "max_cost",               # --max-cost exceeded
    "consecutive_timeouts",   # several commands in a row ran out of time
    "cancelled",              # `pid cancel`, Ctrl-C, or the job lost its lease to another worker
    "interrupted",            # Ctrl-C while the job was still being set up
    "provider_error",         # the model's endpoint failed
    "context_overflow",       # the model refused the conversation for its length, even after compacting it
    "sandbox_error",          # the container failed or vanished
    "artifact_error",         # the patch or the asked-for files could not be collected
    "worker_lost",            # the worker died and the job cannot run again
    "client_lost",            # the `pid run` process died (killed?): a foreground job is not run again
    "dispatch_failed",        # the queue refused the job
    "batch_budget",           # its batch's --max-total-cost was reached (pid batch): queued or at its next model call
    "policy_refused",         # the worker's policy does not admit what the job asks (jobs/policy.py): never started
    "bad_workspace",          # --repo's URL has no such ref or path, --workdir is no directory in the image, or the
                              # image is not in the worker's engine
    "error",                  # anything else (a bug or a set-up failure), with its message in `error`
]


# The endings that can come before the agent's first turn (its workspace, its sandbox or its set-up failed first).
BEFORE_THE_AGENT = ("bad_workspace", "policy_refused", "sandbox_error", "error", "interrupted", "worker_lost")

EXIT_CHECK_FAILED = 4   # the agent completed, its check did not pass (non-zero, timed out, cancelled)


@dataclass(frozen=True)
class Ending:
    status: Status
    exit_code: int
    # The workspace is the agent's finished (or stopped) work, so a check of it means something: after the agent
    # stopped by itself, and after a limit other than the wall clock (the work so far may well pass; the wall clock's
    # time is spent, and its container is about to go). Never after a cancel or a failure.
    checked: bool = False


ENDINGS: dict[str, Ending] = {
    "stop": Ending("completed", 0, checked=True),
    "length": Ending("limit", 3, checked=True),   # not finished, as a reached limit; the work so far may pass
    "wall_clock": Ending("limit", 3),
    "max_turns": Ending("limit", 3, checked=True),
    "max_cost": Ending("limit", 3, checked=True),
    "consecutive_timeouts": Ending("limit", 3, checked=True),
    "cancelled": Ending("cancelled", 1),
    "interrupted": Ending("cancelled", 1),
    "provider_error": Ending("failed", 1),
    "context_overflow": Ending("failed", 1),
    "sandbox_error": Ending("failed", 1),
    "artifact_error": Ending("failed", 1),
    "worker_lost": Ending("failed", 1),
    "client_lost": Ending("failed", 1),
    "dispatch_failed": Ending("failed", 1),
    "batch_budget": Ending("cancelled", 1),
    "policy_refused": Ending("failed", 2),   # as bad usage: the job asked for what it may not have
    "bad_workspace": Ending("failed", 2),    # as bad usage: a retry cannot help
    "error": Ending("failed", 1),
}
assert set(ENDINGS) == set(get_args(ExitReason)), "every exit reason has exactly one ending"

STATUSES: tuple[Status, ...] = get_args(Status)
TERMINAL_STATUSES: tuple[Status, ...] = STATUSES   # a job that has a status from this table has ended
JOB_STATUSES = ("queued", "running", *STATUSES)    # every status a job's record can have


def status_of(reason: ExitReason) -> Status:
    return ENDINGS[reason].status


def checks_after(reason: str | None) -> bool:
    """Whether a job's check runs after it ended for this reason (see Ending.checked)."""
    ending = ENDINGS.get(str(reason))
    return ending is not None and ending.checked


def exit_code_of(reason: str | None, check_passed: bool | None = None) -> int:
    """The exit code of a job that ended for `reason`: 0 completed, 1 failed or cancelled, 3 a limit was hit, 4
    completed but its check did not pass. (2 is bad usage: before any job, or a job a worker's policy refused.)
    `check_passed`: None when the job has no check (or it did not run). A limit keeps 3 whatever its check says: the
    agent did not finish, which is the more useful thing to know. An unknown reason, e.g. from a newer worker,
    counts as a failure."""
    ending = ENDINGS.get(str(reason))
    if ending is None:
        return 1
    if ending.exit_code == 0 and check_passed is False:
        return EXIT_CHECK_FAILED
    return ending.exit_code


def check_passed_of(result: dict[str, Any]) -> bool | None:
    """result.json's (or a job record's) `check.passed`; None without a check. A check that is there but says
    nothing readable has not passed."""
    check = result.get("check")
    if check is None:
        return None
    return isinstance(check, dict) and check.get("passed") is True


def check_originals_missing(result: dict[str, Any]) -> list[str]:
    """result.json's (or a batch row's) `check.original_missing`: the --check-original paths the original workspace
    did not have (a misspelt one protects nothing); [] without any."""
    check = result.get("check")
    missing = check.get("original_missing") if isinstance(check, dict) else None
    return [str(path) for path in missing] if isinstance(missing, list) else []


def exit_code_for(result: dict[str, Any]) -> int:
    """The CLI's exit code for a result.json (see exit_code_of)."""
    return exit_code_of(result.get("exit_reason"), check_passed_of(result))


def ending_words(status: object, reason: object) -> str:
    """"cancelled", "completed (stop)": the reason in brackets only when it adds to the status."""
    return str(status) if reason == status or reason is None else f"{status} ({reason})"
