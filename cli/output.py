"""How a job looks in a terminal: one line per tool call, then the final message and a summary."""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

import click

from pid import events as ev
from pid.event_records import EventRecords
from pid.messages import AssistantMessage, ToolCall, ToolResultMessage, message_from_dict
from pid.tools.summary import summarize_call


def tool_line(name: str, summary: str, is_error: bool, error_line: str | None, duration_s: float | None) -> str:
    mark = click.style("✗", fg="red") if is_error else click.style("✓", fg="green")
    took = f"  {duration_s:.2f}s" if duration_s is not None else ""
    line = f"{mark} {click.style(name, bold=True)} {summary}{took}"
    if is_error:
        line += click.style(f"  — {(error_line or '')[:100]}", fg="red")
    return line


def _result_line(name: str, args: dict[str, Any], result: ToolResultMessage, duration_s: float | None) -> str:
    last = result.text.strip().splitlines()[-1:] or [""]
    return tool_line(name, summarize_call(name, args), result.is_error, last[0], duration_s)


class RecordPrinter:
    """Prints a job's log records (pid/event_records.py) on stderr: a line per tool call as it ends, model errors,
    and what happened to the job (an attempt started, handed back, put back). With as_json, each record is one JSON
    line on stdout instead."""

    def __init__(self, as_json: bool = False) -> None:
        self.as_json = as_json

    def __call__(self, record: dict[str, Any]) -> None:
        if self.as_json:
            click.echo(json.dumps(record, ensure_ascii=False))
            return
        kind = record.get("type")
        if kind == "tool_end":
            click.echo(tool_line(str(record.get("name")), str(record.get("summary", "")), bool(record.get("is_error")),
                                 record.get("error_line"), record.get("duration_s")), err=True)
        elif kind == "assistant" and record.get("error"):
            click.echo(click.style(f"model error: {record['error']}", fg="red"), err=True)
        elif kind == "job" and record.get("note"):
            click.echo(click.style(f"· {record['note']}", dim=True), err=True)


class EventPrinter:
    """An event sink for `pid run`: the same lines a job's log prints, straight from its events."""

    def __init__(self) -> None:
        self._records = EventRecords()
        self._printer = RecordPrinter()

    def __call__(self, event: ev.Event) -> None:
        record = self._records(event)
        if record is not None:
            self._printer(record)


class SessionFollower:
    """Prints the tool calls of a session file as a worker appends to it (for `submit --wait`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self._calls: dict[str, ToolCall] = {}

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self._offset:  # a retried job started a new transcript
                    self._offset, self._partial = 0, b""
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("type") != "message":
                continue
            message = message_from_dict(entry["message"])
            if isinstance(message, AssistantMessage):
                self._calls.update({c.id: c for c in message.tool_calls})
            elif isinstance(message, ToolResultMessage):
                call = self._calls.pop(message.tool_call_id, None)
                click.echo(_result_line(message.tool_name, call.arguments if call else {}, message, None), err=True)


def print_result(result: dict[str, Any], job_dir: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2, ensure_ascii=False))
        return
    if result.get("final_message"):
        click.echo(result["final_message"])
    status = result.get("status", "?")
    colour = {"completed": "green", "limit": "yellow", "cancelled": "yellow"}.get(status, "red")
    usage = result.get("usage") or {}
    summary = (f"{click.style(status, fg=colour, bold=True)} ({result.get('exit_reason')}) in "
               f"{result.get('duration_s', 0):.1f}s · {_count(result.get('turns', 0), 'turn')} · "
               f"{_count(result.get('tool_calls', 0), 'tool call')} · {_count(usage.get('total_tokens', 0), 'token')}")
    click.echo(summary, err=True)
    if result.get("error"):
        click.echo(click.style(f"error: {result['error']}", fg="red"), err=True)
    click.echo(f"artifacts: {os.path.relpath(job_dir)}", err=True)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def wait_for(done: Callable[[], bool], follower: SessionFollower | None, poll_s: float = 0.2,
             timeout_s: float | None = None, tick: Callable[[], None] | None = None) -> None:
    """Poll `done` (printing the follower's news) until it is true or `timeout_s` passes; `tick` runs each poll."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not done() and (deadline is None or time.monotonic() < deadline):
        if follower:
            follower.poll()
        if tick:
            tick()
        time.sleep(poll_s)
    if follower:
        follower.poll()
    sys.stderr.flush()
