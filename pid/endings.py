"""How a job can end: one table from exit reason to status and exit code. Everything else derives from it.

Code that ends a job names only the reason; the status and the CLI's exit code are looked up here, so they cannot
disagree between the loop, the runner, the worker, the store and the CLI.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

Status = Literal["completed", "failed", "limit", "cancelled"]
ExitReason = Literal[
    "stop",                   # the model answered without calling a tool
    "wall_clock",             # --timeout reached
    "max_turns",              # --max-turns reached
    "max_cost",               # --max-cost exceeded
    "consecutive_timeouts",   # several commands in a row ran out of time
    "cancelled",              # `pid cancel`, Ctrl-C, or the job lost its lease to another worker
    "interrupted",            # Ctrl-C while the job was still being set up
    "provider_error",         # the model's endpoint failed
    "sandbox_error",          # the container failed or vanished
    "artifact_error",         # the patch or the asked-for files could not be collected
    "worker_lost",            # the worker died and the job cannot run again
    "client_lost",            # the `pid run` process died (killed?): a foreground job is not run again
    "dispatch_failed",        # the queue refused the job
    "batch_budget",           # its batch's --max-total-cost was reached (pid batch): queued or at its next model call
    "error",                  # anything else (a bug or a set-up failure), with its message in `error`
]


@dataclass(frozen=True)
class Ending:
    status: Status
    exit_code: int


ENDINGS: dict[str, Ending] = {
    "stop": Ending("completed", 0),
    "wall_clock": Ending("limit", 3),
    "max_turns": Ending("limit", 3),
    "max_cost": Ending("limit", 3),
    "consecutive_timeouts": Ending("limit", 3),
    "cancelled": Ending("cancelled", 1),
    "interrupted": Ending("cancelled", 1),
    "provider_error": Ending("failed", 1),
    "sandbox_error": Ending("failed", 1),
    "artifact_error": Ending("failed", 1),
    "worker_lost": Ending("failed", 1),
    "client_lost": Ending("failed", 1),
    "dispatch_failed": Ending("failed", 1),
    "batch_budget": Ending("cancelled", 1),
    "error": Ending("failed", 1),
}
assert set(ENDINGS) == set(get_args(ExitReason)), "every exit reason has exactly one ending"

STATUSES: tuple[Status, ...] = get_args(Status)
TERMINAL_STATUSES: tuple[Status, ...] = STATUSES   # a job that has a status from this table has ended


def status_of(reason: ExitReason) -> Status:
    return ENDINGS[reason].status


def exit_code_for(result: dict[str, Any]) -> int:
    """The CLI's exit code for a result.json: 0 completed, 1 failed or cancelled, 3 a limit was hit.
    (2 is bad usage, before any job.) An unknown reason, e.g. from a newer worker, counts as a failure."""
    ending = ENDINGS.get(str(result.get("exit_reason")))
    return ending.exit_code if ending is not None else 1
