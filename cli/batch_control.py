"""`pid batch --status DIR`'s table of items and `pid batch --cancel DIR`'s lines, from the batch directory's ledger
and the job store's records of the batch's jobs (pid/jobs/batch_control.py has them as data)."""
from __future__ import annotations

from typing import Any

from pid.jobs.batch_control import item_rows
from pid.cli.table import Column, cut, render
from pid.costs import format_cost
from pid.terminal import one_line
from pid.jobs.batch import BatchDir

ITEM_COLUMNS = [Column("ITEM", shrink="end", min=8), Column("JOB", shrink="end"), Column("STATUS"),
                Column("TURNS", right=True), Column("COST", right=True), Column("DETAIL", shrink="start", min=12)]
DETAIL_SHOWN = 80


def item_lines(bdir: BatchDir, records: dict[str, Any], width: int | None) -> list[str]:
    """The header, then a line per item in the tasks file's order: its current job, status, turns, cost, and what
    it is doing now (running) or why it ended."""
    rows = [[one_line(r["id"]), one_line(r["job_id"] or "-"), r["status"], str(r["turns"]), format_cost(r["cost"]),
             cut(one_line(r["detail"]), DETAIL_SHOWN, "start")] for r in item_rows(bdir, records)]
    return render(ITEM_COLUMNS, rows, width)


def cancel_lines(cancelled: list[dict[str, str]]) -> list[str]:
    """A line per job pid.jobs.batch_control.cancel() cancelled."""
    said = {"running": "cancelling (its worker stops it)", "cancelled": "cancelled"}
    return [f"{one_line(job['item'])}  {job['job']}: {said[job['status']]}" for job in cancelled]
