"""A job's live log: its events as small JSON records, for people watching it from anywhere (the job store keeps
them; `pid logs`, `submit --wait` and `result --wait` print them; `pid run` prints the same lines directly).

A record is bounded whatever the agent does: a tool call is its name, a one-line summary and an excerpt of its output
(its first and last lines, each cut short: what `--verbose` shows); an assistant message is its first TEXT_MAX
characters; every text in it is as a terminal may show it (pid/terminal.py).
Text deltas and tool output updates are not kept: a log is for what happened, the session file for everything.
"""
from __future__ import annotations

import time
from typing import Any

from pid import events as ev
from pid.messages import AssistantMessage
from pid.terminal import one_line, shown
from pid.tools.schema import NOT_RUN, REFUSED_OPENINGS, VALIDATION_FAILED
from pid.tools.summary import summarize_call

TEXT_MAX = 2000
CONTROL_TEXT_MAX = 500   # of a steer's or follow-up's message
EXCERPT_HEAD, EXCERPT_TAIL = 3, 5   # lines of a tool's output kept in its record: the first and the last
EXCERPT_WIDTH = 200                 # characters kept of each


class EventRecords:
    """Turns one job's events into records (it remembers each running call's arguments for its end's summary)."""

    def __init__(self) -> None:
        self._summaries: dict[str, str] = {}

    def __call__(self, event: ev.Event) -> dict[str, Any] | None:
        now = round(time.time(), 3)
        if isinstance(event, ev.TurnStart):
            return {"type": "turn_start", "turn": event.turn, "t": now}
        if isinstance(event, ev.ToolStart):
            summary = summarize_call(event.name, event.arguments)
            self._summaries[event.call_id] = summary
            return {"type": "tool_start", "call_id": event.call_id, "name": event.name, "summary": summary, "t": now}
        if isinstance(event, ev.ToolEnd):
            record: dict[str, Any] = {
                "type": "tool_end", "call_id": event.call_id, "name": event.name,
                "summary": self._summaries.pop(event.call_id, ""), "duration_s": round(event.duration_s, 3),
                "is_error": event.result.is_error, "output": output_excerpt(event.result.text), "t": now}
            if event.result.is_error:   # bash's says how it ended last; the other tools, and a refused call, why first
                lines = [line for line in event.result.text.strip().splitlines() if line.strip()] or [""]
                ending = event.name == "bash" and not refused(lines[0])
                record["error_line"] = one_line(lines[-1] if ending else invalid_arguments(lines))[:200]
            return record
        if isinstance(event, ev.MessageEnd) and isinstance(event.message, AssistantMessage):
            message = event.message
            record = {"type": "assistant", "text": shown(message.text)[:TEXT_MAX],
                      "tool_calls": len(message.tool_calls), "stop_reason": message.stop_reason, "t": now}
            if message.stop_reason == "error" and message.error_message:
                record["error"] = shown(message.error_message)[:500]
            return record
        if isinstance(event, ev.CompactionStart):
            return {"type": "compaction_start", "reason": event.reason, "tokens": event.tokens, "t": now}
        if isinstance(event, ev.CompactionEnd):
            record = {"type": "compaction_end", "reason": event.reason, "tokens_before": event.tokens_before,
                      "tokens_after": event.tokens_after, "summarized": event.summarized,
                      "will_retry": event.will_retry, "t": now}
            if event.error:
                record["error"] = shown(event.error)[:500]
            return record
        if isinstance(event, ev.Notice):
            return {"type": "notice", "level": event.level, "text": shown(event.text)[:500], "t": now}
        if isinstance(event, ev.ModelRetry):
            record = {"type": "model_retry", "turn": event.turn, "attempt": event.attempt,
                      "wait_s": round(event.wait_s, 3), "reason": event.reason, "message": event.describe(),
                      "error": shown(event.error)[:500], "t": now}
            if event.status is not None:
                record["status"] = event.status
            return record
        if isinstance(event, ev.Control):
            record = {"type": "control", "kind": event.kind, "stage": event.stage, "t": now}
            if event.text is not None:
                record["text"] = shown(event.text)[:CONTROL_TEXT_MAX]
            return record
        if isinstance(event, ev.AgentEnd):
            return {"type": "agent_end", "status": event.status, "exit_reason": event.exit_reason, "t": now}
        if isinstance(event, ev.CheckStart):
            return {"type": "check_start", "command": _short_command(event.command), "t": now}
        if isinstance(event, ev.CheckEnd):
            check = event.check
            record = {"type": "check_end", "command": _short_command(str(check.get("command", ""))),
                      "passed": bool(check.get("passed")), "exit_code": check.get("exit_code"),
                      "timed_out": bool(check.get("timed_out")), "duration_s": check.get("duration_s"), "t": now}
            if not record["passed"]:
                last = (check.get("error") or str(check.get("output_tail") or "")).strip().splitlines()[-1:] or [""]
                record["error_line"] = one_line(last[0])[:200]
                for flag in ("error", "cancelled"):   # (how it failed: cli/output.py check_failure; not "killed")
                    if check.get(flag):
                        record[flag] = True
            return record
        return None


def output_excerpt(text: str) -> list[str]:
    """A tool's output (as the model saw it) in a few lines for a person: the first EXCERPT_HEAD and the last
    EXCERPT_TAIL, a line saying how many were left out between, each line shown and cut to EXCERPT_WIDTH."""
    lines = shown(text).expandtabs(4).rstrip("\n").splitlines()
    if len(lines) > EXCERPT_HEAD + EXCERPT_TAIL + 1:
        left_out = len(lines) - EXCERPT_HEAD - EXCERPT_TAIL
        lines = [*lines[:EXCERPT_HEAD], f"… {left_out} more lines", *lines[-EXCERPT_TAIL:]]
    return [line if len(line) <= EXCERPT_WIDTH else line[:EXCERPT_WIDTH - 1] + "…" for line in lines]


def _short_command(command: str, width: int = 200) -> str:
    """A command as one short line (a check may be a whole script)."""
    text = one_line(command)
    return text if len(text) <= width else text[:width - 1] + "…"


def job_record(status: str, **fields: Any) -> dict[str, Any]:
    """A change of the job's own state, written by whoever changes it (a worker starts it, hands it back, a sweep
    puts it back, it ends)."""
    return {"type": "job", "status": status, **{k: v for k, v in fields.items() if v is not None},
            "t": round(time.time(), 3)}


def refused(first_line: str) -> bool:
    """The error of a call refused before it ran (not a command's output, whose last line says how it ended)."""
    return first_line.startswith(VALIDATION_FAILED) or (first_line.startswith(REFUSED_OPENINGS)
                                                         and NOT_RUN in first_line)


def invalid_arguments(lines: list[str]) -> str:
    """A failed call's first line, or for arguments the tool refused the first problem ("timeout: must be > 0"), not
    the echo of the arguments after it."""
    if lines[0].startswith(VALIDATION_FAILED) and len(lines) > 1:
        return lines[1].strip().removeprefix("- ")
    return lines[0]
