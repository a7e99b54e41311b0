"""What a job leaves behind: its result.json (built the same way whether it ran to its end or ended unrun), the
counts of its earlier attempts, and the records of what happened to it in its log; and where a job's files are
made on this machine. Shared by the worker and the client (a cancel or a sweep ends a job here and now)."""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from pid.costs import format_cost
from pid.endings import ending_words, status_of
from pid.event_records import job_record
from pid.session import iso_time
from pid.jobs.spec import JobSpec
from pid.jobs.store import JobAttachments

if TYPE_CHECKING:   # for the annotation only: a client command loads the agent only to end a job (jobs/sweep.py)
    from pid.agent import Outcome

log = logging.getLogger("pid.worker")

EMPTY_ANSWER = "the model's final answer was empty"


def build_result(spec: JobSpec, outcome: Outcome, started: float, artifacts: dict[str, Any],
                 workspace: dict[str, Any] | None = None, check: dict[str, Any] | None = None) -> dict[str, Any]:
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
    for key in ("parent", "retry_of"):   # the job this one continues, or runs again
        if getattr(spec, key, None):
            result[key] = getattr(spec, key)
    if check is not None:   # the job's exit code follows from it: pid.endings.exit_code_for
        result["check"] = check
    if outcome.error:
        result["error"] = outcome.error
    if outcome.exit_reason == "stop" and not (outcome.final_message or "").strip():
        result["warning"] = EMPTY_ANSWER   # completed, and the model said nothing: worth a look
    return result


def client_is_local() -> bool:
    """Whether a job's submitter is on this machine, as this worker's user: the embedded broker is a directory under
    PID_HOME, so only they reach it. Through a broker of the network, a job's --out is a path on some other machine
    that anyone who can submit may have named: a worker running as root must not write there."""
    from pid.jobs.brokers import embedded_broker
    return embedded_broker()


def spool_dir(job_id: str, attempt: int) -> str:
    """Where an attempt of a worker job works when the client's --out cannot be made on this machine: each attempt
    its own, removed at its end (a worker that froze, lost the job and woke up removed the one its job's next
    attempt was working in, patch and transcript with it)."""
    from pid.config import pid_home
    return os.path.join(pid_home(), "spool", f"{job_id}.{attempt}")


def attempt_usage(result: dict[str, Any]) -> dict[str, Any] | None:
    """The usage of the attempt that produced `result` (its `usage` counts the earlier attempts too)."""
    per_attempt = result.get("per_attempt")
    return per_attempt[-1]["usage"] if per_attempt else result.get("usage")


def with_earlier_attempts(result: dict[str, Any], earlier: list[dict[str, Any]],
                          first_started: float | None = None) -> None:
    """A job taken up again (its worker died, or stopped and handed it back): its result counts what the earlier
    attempts spent, and how long the job took.

    `usage` becomes the sum over attempts; `per_attempt` lists each attempt's own turns, tool calls and usage, and
    this attempt's duration (turns and tool_calls stay this attempt's: they describe this attempt's transcript,
    session.jsonl). With `first_started` (the store's start of the job's first attempt), `started_at` and
    `duration_s` become the job's, as `pid list` and `pid status` show them."""
    if not earlier:
        return
    from pid.jobs.store import sum_usage
    this = {"attempt": len(earlier) + 1, "turns": result.get("turns", 0), "tool_calls": result.get("tool_calls", 0),
            "usage": result.get("usage") or {}, "duration_s": result.get("duration_s")}
    result["per_attempt"] = [*earlier, this]
    result["usage"] = sum_usage(*(a.get("usage") or {} for a in result["per_attempt"]))
    if first_started is not None:   # (built just now: its end is this moment; another machine's clock may lag)
        result["started_at"] = iso_time(first_started)
        result["duration_s"] = round(max(time.time() - first_started, this["duration_s"] or 0.0), 3)


def end_line(job_id: str, status: str | None, exit_reason: str | None, duration_s: float | None,
             cost: float | None, check: dict[str, Any] | None = None) -> str:
    """How a job ended, in one line: its worker's log and the job's own (`pid logs`) end with it."""
    line = f"job {job_id} {ending_words(status, exit_reason)}"
    if duration_s is not None:
        line += f" in {duration_s:.1f}s"
    if cost:
        line += f" · {format_cost(cost)}"
    if check is not None:
        line += " · check passed" if check.get("passed") is True else " · check FAILED"
    return line


def result_line(job_id: str, result: dict[str, Any]) -> str:
    """end_line of a result.json (or of an ending that has only its exit reason and error)."""
    return end_line(job_id, status_of(result["exit_reason"]), result["exit_reason"], result.get("duration_s"),
                    (result.get("usage") or {}).get("cost"), result.get("check"))


def log_end(store: JobAttachments, job_id: str, result: dict[str, Any], line: str) -> None:
    """The job's log ends with its end line (`line`: result_line's), as its record in the store ended it."""
    reason = result["exit_reason"]
    log_job(store, job_id, status_of(reason), line, exit_reason=reason)


def log_job(store: JobAttachments, job_id: str, status: str, note: str, **fields: Any) -> None:
    """One record of what happened to the job itself (started, handed back, put back, ended) in its log."""
    try:
        store.append_event(job_id, job_record(status, note=note, **fields))
    except Exception:
        log.warning("job %s: its log record (%s) not written to the store", job_id, note)
