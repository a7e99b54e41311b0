"""A tool call's line cuts a long reason visibly ("…"), so a reader never takes a cut one for the whole (issue 22)."""
from __future__ import annotations

from pid.cli.output import control_line, tool_line


def text_of(parts: list) -> str:
    return "".join(p if isinstance(p, str) else p.text for p in parts)


def test_a_long_reason_is_cut_with_an_ellipsis() -> None:
    reason = ("Could not find the exact text in calc.py. The old text must match exactly including all whitespace "
              "and newlines.")
    line = text_of(tool_line("edit", "calc.py", True, reason, 0.01))
    assert line.rstrip().endswith("…")


def test_a_short_reason_is_whole() -> None:
    line = text_of(tool_line("edit", "calc.py", True, "file not found", 0.01))
    assert line.rstrip().endswith("— file not found")


def test_a_waiting_command_leaves_the_job_s_end_to_its_summary() -> None:
    """`submit --wait` prints a summary of the job's end: its log's end record is not said before it as well."""
    from pid.cli.output import RecordPrinter
    said: list[str] = []

    def out(*parts, **_kw) -> None:
        said.append(text_of(list(parts)))
    end = {"type": "job", "status": "completed", "exit_reason": "stop", "note": "job j completed (stop) in 1.0s"}
    start = {"type": "job", "status": "running", "note": "attempt 1 started on vm"}
    for record in (start, end):
        RecordPrinter(out=out, summary_follows=True)(record)
    assert said == ["· attempt 1 started on vm"]
    RecordPrinter(out=out)(end)   # pid logs: its end is the log's last line
    assert said[-1] == "· job j completed (stop) in 1.0s"


def test_pid_s_own_stop_is_not_said_as_the_user_s_cancel() -> None:
    """A worker that stops hands its job back: the agent's cancel then carries pid's reason (a new-user test read
    "→ cancel sent" there as a cancel of theirs)."""
    why = "its worker stops (SIGTERM): the job goes back to the queue"
    assert control_line({"kind": "cancel", "stage": "sent", "text": why}) == f"→ pid stops the agent: {why}"
    assert control_line({"kind": "cancel", "stage": "sent"}) == "→ cancel sent"
    assert control_line({"kind": "cancel", "stage": "received"}) == "← cancel received: the agent stops"
    # and as the agent takes it: not "cancel received" for a job that goes back to the queue (a new user's)
    assert control_line({"kind": "cancel", "stage": "received", "text": why}) == "← the agent stops"
