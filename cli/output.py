"""How a job looks in a terminal: one line per tool call, then the final message and a summary.

`echo` is how every `pid` command writes to the terminal: each part of a message passes through the one sanitiser
(pid/terminal.py) before pid's own styles are added, so no model, agent, task, server or store reaches the terminal
with an escape sequence. A field of a one-line listing also goes through one_line (a newline in it would start a line
that pid did not write). --json output is terminal.dumps: exact JSON, with those characters \\u-escaped. The one
control sequence pid writes itself (pid/terminal.py CLEAR_LINE, for a live status line) is written only here.
"""
from __future__ import annotations

import errno
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import click

from pid.costs import format_cost
from pid.endings import check_originals_missing
from pid.terminal import CLEAR_LINE, dumps, one_line, shown
from pid.jobs.spec import json_text

if TYPE_CHECKING:   # (the events module loads only where a job's events are printed: not in `pid submit`)
    from pid import events as ev

CHECK_LINES_SHOWN = 15   # of a failed check's output_tail, under the summary (all of it is in result.json)


class Styled(NamedTuple):
    """Part of a message printed in a style (click.style's keywords), after the sanitiser."""
    text: str
    style: dict[str, Any]


def styled(text: str, **style: Any) -> Styled:
    return Styled(text, style)


Part = str | Styled


def echo(*parts: Part, err: bool = False, nl: bool = True, clear: bool = False) -> None:
    """Print one message made of `parts` (and a newline, unless not `nl`). The only way pid's commands write to the
    terminal: each part goes through pid.terminal.shown, then a Styled part gets its style. `clear`: first erase the
    cursor's line (a status line, on a terminal). A reader that went away (`pid run … | head`, or a terminal closed:
    EIO after SIGHUP) only stops the output: see _gone."""
    try:
        text = "".join(click.style(shown(p.text), **p.style) if isinstance(p, Styled) else shown(p) for p in parts)
        click.echo(CLEAR_LINE + text if clear else text, err=err, nl=nl)
    except OSError as exc:
        if not isinstance(exc, BrokenPipeError) and exc.errno != errno.EIO:
            raise
        _gone(sys.stderr if err else sys.stdout)


def _gone(stream: Any) -> None:
    """The stream's reader closed it: what follows goes to /dev/null (the interpreter's last flush included), and
    nothing else changes. A closed stdout never ends a job: it runs on, ends as it would, and exits with its code."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError):
        pass


def tool_line(name: str, summary: str, is_error: bool, error_line: str | None,
              duration_s: float | None) -> list[Part]:
    took = f"  {duration_s:.2f}s" if duration_s is not None else ""
    line: list[Part] = [styled("✗", fg="red") if is_error else styled("✓", fg="green"), " ",
                        styled(one_line(name), bold=True), f" {one_line(summary)}{took}"]
    if is_error:
        reason = one_line(error_line or "")
        line.append(styled(f"  — {reason if len(reason) <= 100 else reason[:99] + '…'}", fg="red"))
    return line


def compaction_line(record: dict[str, Any]) -> str:
    """One line for a compaction: why, how much, and whether it worked."""
    why = "refused for length" if record.get("reason") == "overflow" else "context full"
    before = record.get("tokens_before") or 0
    if record.get("error"):
        return f"· compaction failed ({why}, {before:,} tokens): {one_line(str(record['error']))}"
    return (f"· context compacted ({why}): {before:,} -> {record.get('tokens_after') or 0:,} tokens, "
            f"{record.get('summarized', 0)} messages summarised" + (", retrying" if record.get("will_retry") else ""))


CONTROL_RECEIVED = {"pause": "the agent holds before its next model call", "resume": "the agent goes on",
                    "cancel": "the agent stops"}


def control_line(record: dict[str, Any]) -> str:
    """A control as it is sent (→) and as the agent receives it (←): `→ steer sent: …`, `← pause received: …`. A
    cancel sent with a reason is pid's, not the user's (its worker stops, or lost the job): said as such."""
    kind = str(record.get("kind", "?"))
    sent = record.get("stage") == "sent"
    text = record.get("text")
    if kind == "cancel" and text is not None:   # (received: the agent stopped for that, not for a user's cancel)
        return f"→ pid stops the agent: {one_line(str(text))[:100]}" if sent else "← the agent stops"
    if text is not None:
        what = one_line(str(text))[:100]
    else:
        what = "" if sent else CONTROL_RECEIVED.get(kind, "")
    return (f"{'→' if sent else '←'} {one_line(kind.replace('_', '-'))} {'sent' if sent else 'received'}"
            + (f": {what}" if what else ""))


class RecordPrinter:
    """Prints a job's log records (pid/event_records.py) on stderr: a line per tool call as it ends, model errors,
    and what happened to the job (an attempt started, handed back, put back). With as_json, each record is one JSON
    line on stdout instead. `verbose`: a line as each tool call starts too, and its output excerpt under its end's.
    `out`: where the lines go (echo's signature; a status line's echo keeps itself below them). `summary_follows`
    (`submit --wait`): the job's end is said once, by the summary, not also by its log's end record."""

    def __init__(self, as_json: bool = False, err: bool = True, verbose: bool = False,
                 out: Callable[..., None] = echo, summary_follows: bool = False) -> None:
        self.as_json, self.err, self.verbose, self.out = as_json, err, verbose, out
        self.summary_follows = summary_follows   # the job's end record is left to the summary printed after it
        self.said: set[str] = set()   # errors and the check's verdict printed: the summary does not repeat them

    def __call__(self, record: dict[str, Any]) -> None:
        echo = self.out
        if self.as_json:
            echo(dumps(json_text(record)))
            return
        kind, err = record.get("type"), self.err
        if kind == "tool_end":
            echo(*tool_line(str(record.get("name")), str(record.get("summary", "")), bool(record.get("is_error")),
                            record.get("error_line"), record.get("duration_s")), err=err)
            if self.verbose:
                for line in record.get("output") or []:
                    echo(styled(f"  │ {shown(str(line))}", dim=True), err=err)
        elif kind == "tool_start" and self.verbose:   # (a long call shows as it starts: its ✓ line waits for its end)
            echo(styled(f"· {one_line(str(record.get('name')))} {one_line(str(record.get('summary', '')))} …",
                        dim=True), err=err)
        elif kind == "check_start":
            echo(styled(f"· check: {one_line(str(record.get('command', '')))}", dim=True), err=err)
        elif kind == "check_end":
            passed = bool(record.get("passed"))
            why = "" if passed else check_failure(record) + (f": {record['error_line']}" if record.get("error_line")
                                                              else "")
            echo(*tool_line("check", str(record.get("command", "")), not passed, why, record.get("duration_s")),
                 err=err)
            self.said.add(CHECK_SAID)
        elif kind == "model_retry":
            status = f"HTTP {record['status']}, " if record.get("status") else ""
            echo(styled(f"· {one_line(str(record.get('message')))} ({status}attempt {record.get('attempt')} failed)",
                        fg="yellow"), err=err)
        elif kind == "assistant" and record.get("error"):
            echo(styled(f"model error: {one_line(str(record['error']))}", fg="red"), err=err)
            self.said.add(said_key(str(record["error"])))
        elif kind == "compaction_end":
            echo(styled(compaction_line(record), fg="red" if record.get("error") else None, dim=True), err=err)
        elif kind == "notice":
            echo(styled(f"{one_line(str(record.get('level', 'warning')))}: {one_line(str(record.get('text')))}",
                        fg="yellow"), err=err)
        elif kind == "control":
            echo(styled(control_line(record), fg="cyan"), err=err)
        elif kind == "job" and record.get("note") and not (self.summary_follows and record.get("exit_reason")):
            echo(styled(f"· {one_line(str(record['note']))}", dim=True), err=err)
        elif kind == "dropped":
            why = f" ({one_line(str(record['why']))})" if record.get("why") else ""
            echo(styled(f"· {record.get('count')} log record(s) dropped{why}", dim=True), err=err)


class EventPrinter:
    """An event sink for `pid run`: the same lines a job's log prints, straight from its events."""

    def __init__(self, verbose: bool = False, out: Callable[..., None] = echo) -> None:
        from pid.event_records import EventRecords   # (and the tools' summaries: only where records are shown)
        self._records = EventRecords()
        self._printer = RecordPrinter(verbose=verbose, out=out)
        self.said = self._printer.said

    def __call__(self, event: ev.Event) -> None:
        record = self._records(event)
        if record is not None:
            self._printer(record)


class EventFollower:
    """Prints a job's log records as they reach its store (`pid logs -f`, `submit --wait`, `result --wait`): from
    any machine that shares the store, whichever worker runs the job."""

    def __init__(self, store: Any, job_id: str, printer: Callable[[dict[str, Any]], None]) -> None:
        self.store, self.job_id, self.printer = store, job_id, printer
        self.after = 0

    def poll(self, wait_s: float = 0) -> None:
        from pid.jobs.store import with_dropped
        try:
            records = self.store.events(self.job_id, after=self.after, wait_s=wait_s)
        except Exception:   # a store briefly unreachable: the next poll catches up
            return
        for n, record in with_dropped(records, self.after):
            self.printer(record)
            self.after = n


def check_failure(check: dict[str, Any]) -> str:
    """How a check failed, in a few words."""
    if check.get("error"):
        return "could not run"
    if check.get("timed_out"):
        return "timed out: --check-timeout"
    if check.get("cancelled"):
        return "cancelled"
    failure = "killed" if check.get("exit_code") is None else f"exit {check.get('exit_code')}"
    return failure + ("; the container ran out of memory (--memory)" if check.get("out_of_memory") else "")


def check_line(check: dict[str, Any]) -> list[Part]:
    """result.json's check as one line: `check passed (python3 -m unittest) in 1.2s` or `check FAILED (exit 1) …`."""
    took = check.get("duration_s")
    took_text = f" in {took:.1f}s" if isinstance(took, (int, float)) else ""
    command = one_line(str(check.get("command", "")))
    command = command if len(command) <= 80 else command[:79] + "…"
    if check.get("passed") is True:
        return [styled("check passed", fg="green", bold=True), f"{took_text}: {command}"]
    return [styled("check FAILED", fg="red", bold=True), f" ({check_failure(check)}){took_text}: {command}"]


CHECK_SAID = "\0check"   # (in RecordPrinter.said: the check's verdict was printed)


def said_key(text: str) -> str:
    """An error as RecordPrinter.said remembers it, so that its summary recognises it (a record keeps 500 chars)."""
    return one_line(text)[:200]


def missing_originals_warning(result: dict[str, Any]) -> str | None:
    """The warning for --check-original paths the original workspace did not have (result.json's check), if any."""
    missing = check_originals_missing(result)
    if not missing:
        return None
    return ("--check-original " + ", ".join(one_line(p) for p in missing) + ": not in the original workspace, "
            "so the check saw none there (right for a file the patch adds; else a misspelt path, which protects "
            "nothing)")


REFUSED_SHOWN = 3   # what the artifacts left out, named in the warning line (all of it is in result.json)


def refused_warning(result: dict[str, Any]) -> str | None:
    """What the artifacts left out (result.json's artifacts.refused: a missing --file, a patch section or file that
    could not be taken) as one line, if anything."""
    artifacts = result.get("artifacts")
    refused = artifacts.get("refused") if isinstance(artifacts, dict) else None
    if not isinstance(refused, list) or not refused:
        return None
    named = []
    for entry in refused[:REFUSED_SHOWN]:
        entry = entry if isinstance(entry, dict) else {}
        kind = "--file" if entry.get("artifact") == "files" else str(entry.get("artifact", "?"))
        named.append(f"{kind} {one_line(str(entry.get('path', '?')))} ({one_line(str(entry.get('reason', '?')))})")
    more = f" and {len(refused) - REFUSED_SHOWN} more" if len(refused) > REFUSED_SHOWN else ""
    return "left out of the artifacts: " + ", ".join(named) + more + " (result.json's artifacts.refused)"


def _warn_under_the_summary(result: dict[str, Any]) -> None:
    """What the job's artifacts or its check lack that the user should hear of (missing originals, refused paths)."""
    for text in (missing_originals_warning(result), refused_warning(result)):
        if text:
            echo(styled(f"warning: {text}", fg="yellow"), err=True)


def print_result(result: dict[str, Any], job_dir: str, as_json: bool, said: set[str] | frozenset[str] = frozenset()
                 ) -> None:
    """The final message and the summary. `said`: what the job's live lines printed already (RecordPrinter.said):
    its check's verdict and errors are not said twice."""
    if as_json:
        echo(dumps(json_text(result), indent=2))
        _warn_under_the_summary(result)   # (on stderr: a CI gate reading the JSON sees it in its log)
        return
    if result.get("final_message"):
        echo(str(result["final_message"]))
    status = one_line(str(result.get("status", "?")))
    reason = one_line(str(result.get("exit_reason")))
    colour = {"completed": "green", "limit": "yellow", "cancelled": "yellow"}.get(status, "red")
    usage = result.get("usage") or {}
    cost = usage.get("cost") or 0
    check = result.get("check")
    failed_check = (styled(f", check FAILED ({check_failure(check)})", fg="red", bold=True)
                    if isinstance(check, dict) and check.get("passed") is not True else "")
    duration = result.get("duration_s")   # (None for a job that never started)
    echo(styled(status, fg=colour, bold=True), "" if reason == status else f" ({reason})", failed_check,
         f" in {duration if isinstance(duration, (int, float)) else 0:.1f}s · "
         f"{_count(result.get('turns', 0), 'turn')} · {_count(result.get('tool_calls', 0), 'tool call')} · "
         f"{_count(usage.get('total_tokens', 0), 'token')} · "
         f"{format_cost(cost if isinstance(cost, (int, float)) else 0)}", err=True)
    if isinstance(check, dict):
        if CHECK_SAID not in said:
            echo(*check_line(check), err=True)
        if check.get("passed") is not True:
            if check.get("error"):
                echo(styled(f"check error: {one_line(str(check['error']))}", fg="red"), err=True)
            tail = shown(str(check.get("output_tail") or "")).splitlines()[-CHECK_LINES_SHOWN:]
            if tail and CHECK_SAID in said:   # (its verdict was the live line: this says whose output follows)
                echo(styled("check output, its last lines:", dim=True), err=True)
            for line in tail:
                echo(f"  {line}", err=True)
    _warn_under_the_summary(result)
    if result.get("error") and said_key(str(result["error"])) not in said:
        echo(styled(f"error: {one_line(str(result['error']))}", fg="red"), err=True)
    if result.get("warning"):
        echo(styled(f"warning: {one_line(str(result['warning']))}", fg="yellow"), err=True)
    if os.path.isdir(job_dir):
        echo(f"artifacts: {os.path.relpath(job_dir)}", err=True)
    else:   # (another machine's, or a batch's spool, removed once its item's folder got them)
        echo(f"artifacts: not here (pid result {result.get('id', 'ID')} --download DIR fetches them)", err=True)


def _count(n: int, noun: str) -> str:
    return (f"{n:,}" if isinstance(n, int) else str(n)) + f" {noun}" + ("" if n == 1 else "s")   # (as the status line)


def wait_for(done: Callable[[], bool], follower: EventFollower | None, poll_s: float = 0.2,
             timeout_s: float | None = None, tick: Callable[[], None] | None = None) -> None:
    """Poll `done` (printing the follower's news) until it is true or `timeout_s` passes; `tick` runs each poll. An
    outage of the store is waited through (pid/jobs/outage.py)."""
    from pid.jobs.outage import WaitingThrough
    outage = WaitingThrough(lambda text: echo(f"pid: {text}", err=True))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while deadline is None or time.monotonic() < deadline:
        try:
            if done():
                break
            if follower:
                follower.poll()
            if tick:
                tick()
            outage.reached()
        except Exception as exc:
            if not outage.bear(exc):
                raise
        time.sleep(poll_s)
    if follower:
        follower.poll()
    sys.stderr.flush()


def format_duration(seconds: float | None) -> str:
    """1.5s, 2m05s, 1h02m; "-" for none."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"
