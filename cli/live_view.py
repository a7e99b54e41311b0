"""What `pid run` and `pid logs -f` show on a terminal besides their lines: the status line (cli/status_line.py) and,
for `pid run`, the assistant's reply as it streams. Off a terminal neither exists: the plain lines are all.
"""
from __future__ import annotations

import sys
import time
from typing import Any

from pid.cli.output import EventPrinter
from pid.cli.status_line import StatusLine, status_text
from pid import events as ev
from pid.jobs.progress import Progress


class RunView:
    """`pid run`'s event sink on a terminal (stderr): EventPrinter's lines above a status line fed by the same events
    as `pid status` (jobs/progress.py Progress), and each reply streamed as its text deltas arrive."""

    def __init__(self, verbose: bool = False) -> None:
        self.progress = Progress()
        self.started = time.monotonic()
        self.paused = False
        self.line = StatusLine(err=True, describe=self.describe)
        self.printer = EventPrinter(verbose=verbose, out=self.line.echo)
        self.said = self.printer.said
        self._reply = ""          # the reply streamed last (a retried call's deltas start it again)
        self._reply_key = (0, 0)  # its (turn, attempt)

    def describe(self) -> str:
        snap = self.progress.snapshot()
        usage = snap["usage"]
        return status_text(snap["activity"] or "starting", usage["total_tokens"], usage["cost"],
                           time.monotonic() - self.started, self.paused)

    def __call__(self, event: ev.Event) -> None:
        self.progress.on_event(event)
        if isinstance(event, ev.TextDelta):
            if (event.turn, event.attempt) != self._reply_key:
                self.line.end_stream()   # a retried call's reply starts on a line of its own
                self._reply_key, self._reply = (event.turn, event.attempt), ""
            self._reply += event.text
            self.line.stream(event.text)
            return
        if isinstance(event, ev.Control) and event.stage == "received" and event.kind in ("pause", "resume"):
            self.paused = event.kind == "pause"
        self.line.end_stream()
        if isinstance(event, ev.AgentStart):
            self.line.start()
        self.printer(event)
        self.line.draw()

    def stop(self) -> None:
        self.line.stop()

    def showed_reply(self, text: Any) -> bool:
        """Whether `text` (the final message) is the reply this terminal streamed last, on stdout's terminal too: then
        it need not be printed again."""
        return bool(text) and str(text).strip() == self._reply.strip() and sys.stdout.isatty()


def job_status(record: Any) -> str:
    """`pid logs -f`'s status line, from the job's record in the store (its relay writes its progress there)."""
    usage = record.total_usage
    elapsed = None if record.started_at is None else time.time() - record.started_at
    activity = record.activity if record.activity and record.status == "running" else str(record.status)
    return status_text(activity, int(usage.get("total_tokens") or 0), float(usage.get("cost") or 0), elapsed,
                       bool(record.paused))
