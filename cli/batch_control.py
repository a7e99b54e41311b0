"""`pid batch --status DIR`'s table of items and `pid batch --cancel DIR`'s lines, from the batch directory's ledger
and the job store's records of the batch's jobs (pid/jobs/batch_control.py has them as data)."""
from __future__ import annotations

from typing import Any

from pid.cli.batch_run import item_state
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
    rows = []
    for item_id in bdir.order:
        status, record, row = item_state(bdir, item_id, records, followed=False)
        job_id = bdir.current_job(item_id) or "-"
        if record is not None:
            turns, cost = record.turns, float(record.total_usage.get("cost") or 0)
            if not record.terminal:   # (the activity's own "turn N: " is the turn said once)
                detail = (record.activity or record.status).split(": ", 1)[-1]
            else:
                detail = record.exit_reason or "-"
        elif row is not None:
            turns, cost, detail = int(row.get("turns") or 0), float(row.get("cost") or 0), str(row.get("exit_reason"))
        else:
            turns, cost, detail = 0, 0.0, "-"
        rows.append([one_line(item_id), one_line(job_id), status, str(turns), format_cost(cost),
                     cut(one_line(detail), DETAIL_SHOWN, "start")])
    return render(ITEM_COLUMNS, rows, width)


def cancel_lines(cancelled: list[dict[str, str]]) -> list[str]:
    """A line per job pid.jobs.batch_control.cancel() cancelled."""
    said = {"running": "cancelling (its worker stops it)", "cancelled": "cancelled"}
    return [f"{one_line(job['item'])}  {job['job']}: {said[job['status']]}" for job in cancelled]
