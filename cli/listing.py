"""The rows of `pid list` and `pid workers` (cli/table.py lays them out), and `pid list --batch DIR`'s jobs."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from pid.cli.output import format_duration
from pid.cli.table import Column, cut, render
from pid.costs import format_cost
from pid.errors import PidError
from pid.terminal import one_line

if TYPE_CHECKING:
    from pid.jobs.batch_control import Place

JOB_COLUMNS = [Column("ID", shrink="end"), Column("STATUS"), Column("TIME", right=True),
               Column("COST", right=True), Column("REASON", shrink="start", min=9),
               Column("TASK", shrink="start", min=12)]
WORKER_COLUMNS = [Column("HOST", shrink="start", min=8), Column("PID", right=True), Column("NODE", shrink="end"),
                  Column("RUNNING", right=True), Column("QUEUES", shrink="start", min=8), Column("UP", right=True),
                  Column("STATE")]
ITEM_COLUMN = Column("ITEM", shrink="end", min=8)   # `pid list --batch DIR`: the batch's item each job ran
TASK_SHOWN = 60   # a task's first characters at most, however wide the terminal


def job_lines(records: list[Any], width: int | None, places: list[Place] | None = None) -> list[str]:
    """The header, then a line per record; with `places` (a batch's: batch_records), each record's item first."""
    rows = []
    for record in records:
        reason = record.exit_reason or "-"
        if record.check:   # the check's verdict beside the reason
            reason += " ✓check" if record.check.get("passed") is True else " ✗check"
        status = record.status + (" (paused)" if record.held else "")   # (as pid status)
        rows.append([one_line(record.id), status, format_duration(record.duration_s),
                     format_cost(record.total_usage["cost"]), one_line(reason),
                     cut(one_line(record.spec.task), TASK_SHOWN, "start")])
    if places is None:
        return render(JOB_COLUMNS, rows, width)
    items = ["?" if item is None else one_line(item) + ("" if current else " (earlier)") for item, current in places]
    return render([ITEM_COLUMN, *JOB_COLUMNS], [[item, *row] for item, row in zip(items, rows)], width)


def worker_lines(beats: list[tuple[Any, str]], now: float, width: int | None) -> list[str]:
    """The header, then a line per (heartbeat, state)."""
    rows = []
    for b, state in beats:
        until = now if state == "alive" else (b.stopped_at if state == "stopped" else None) or b.beat_at
        seen = state if state == "alive" else f"{state} {format_duration(now - until)} ago"
        node = b.node.removeprefix(f"{b.host}:{b.pid}:")   # the host and pid have their own columns
        running = b.running if state == "alive" else "-"   # a last beat's count is not what it runs now
        rows.append([one_line(b.host), str(b.pid), one_line(node), f"{running}/{b.concurrency}",
                     one_line(",".join(b.queues)), format_duration(until - b.started_at), seen])
    return render(WORKER_COLUMNS, rows, width)


def pool_entry(entry: dict[str, Any]) -> str:
    """One image of a worker's warm pool: `pid-sandbox:latest 2 ready (41 MiB)`."""
    memory = f" ({entry['memory'] / (1 << 20):.0f} MiB)" if entry.get("memory") else ""
    return f"{one_line(str(entry.get('image')))} {entry.get('ready', 0)} ready{memory}"


class NotABatch(click.ClickException):
    exit_code = 2   # one line (pid.cli.main prints it), as every bad input


def batch_records(store: Any, directory: str, limit: int | None, status: str | None
                  ) -> tuple[list[Any], list[Place]]:
    """`pid list --batch DIR`: that batch's jobs (every attempt of every item), newest first, and where each is in
    the batch (jobs/batch_control.py)."""
    from pid.jobs.batch_control import batch_jobs
    try:
        return batch_jobs(store, directory, limit, status)
    except PidError as exc:
        raise NotABatch(str(exc)) from None
