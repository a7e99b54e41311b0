"""A batch seen from its output directory, without running it: where its items are (`pid batch --status DIR`) and
cancelling its jobs (`pid batch --cancel DIR`), as data. One query of the job store for the batch's jobs each."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pid.errors import PidError
from pid.jobs.batch import BatchDir, check_verdict
from pid.jobs.batch_run import Progress, count, item_state


@dataclass
class Status:
    """Every item by its current job's status (or its recorded end), and the spend."""
    bdir: BatchDir
    counts: dict[str, int]
    cost: float
    info: Any                 # the store's BatchInfo (budget, spent, running limit), or None
    records: dict[str, Any]   # job id -> its record, for the batch's jobs

    def as_dict(self) -> dict[str, Any]:
        """What `pid batch --status DIR --json` prints: the counts, and each item as the table shows it."""
        info = self.info
        return {"batch": self.bdir.batch_id, "items": len(self.bdir.order), "counts": self.counts,
                "cost": round(self.cost, 6),
                "budget": None if info is None else {"max_total_cost": info.max_total_cost, "spent": info.spent,
                                                     "max_running": info.max_running},
                "item_states": item_rows(self.bdir, self.records)}


def item_rows(bdir: BatchDir, records: dict[str, Any]) -> list[dict[str, Any]]:
    """Each item in the tasks file's order: its current job, status, turns, cost, and what it is doing now (running)
    or why it ended."""
    rows = []
    for item_id in bdir.order:
        state, record, row = item_state(bdir, item_id, records, followed=False)
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
        judged = check_verdict(row) if row is not None and row.get("job_id") == bdir.current_job(item_id) else None
        if judged is not None:
            detail = f"{detail}, check {judged}"
        rows.append({"id": item_id, "job_id": bdir.current_job(item_id), "status": state, "turns": turns,
                     "cost": round(cost, 6), "detail": detail, "check": judged})
    return rows


def status(bdir: BatchDir, store: Any) -> Status:
    records = {r.id: r for r in store.batch_jobs(bdir.batch_id)}
    live = {bdir.current_job(i): i for i in bdir.order if bdir.current_job(i) in records
            and not records[bdir.current_job(i)].terminal}
    progress = Progress(total=len(bdir.order))
    count(progress, bdir, records, {j: i for j, i in live.items() if j})
    return Status(bdir, progress.counts, progress.cost, store.batch(bdir.batch_id), records)


def cancel(bdir: BatchDir, store: Any) -> list[dict[str, str]]:
    """Cancel every job of the batch that has not ended (whichever run made it): {"item", "job", "status"} per job,
    status "cancelled" (it was queued: it ended here and now) or "running" (its worker stops it). One sweep at the
    end ends those whose process is gone. A run following the batch meanwhile submits no more of it (and no job of
    it again); the next run that submits it resumes it (BatchDir.mark_cancelled)."""
    from pid.jobs.sweep import cancel_job, sweep_quietly
    bdir.mark_cancelled()   # (first: a run following the batch submits no more, and cancels what it just did)
    items = {job_id: item_id for item_id, jobs in bdir.ledger.items() for job_id in jobs}
    cancelled = []
    for record in store.batch_jobs(bdir.batch_id):
        if record.terminal:
            continue
        state = cancel_job(store, record.id) if record.status == "queued" else store.request_cancel(record.id)
        if str(state) in ("running", "cancelled"):   # (else it ended meanwhile)
            cancelled.append({"item": items.get(record.id, "?"), "job": record.id, "status": str(state)})
    if cancelled:
        sweep_quietly(store)
    return cancelled


Place = tuple[str | None, bool]   # a batch's job: its item (None: the batch's ledger does not name it), and whether
                                  # it is the item's current job (else a newer one replaced it: a retry)


def batch_jobs(store: Any, directory: str, limit: int | None, status: str | None) -> tuple[list[Any], list[Place]]:
    """The jobs of the batch whose output directory is `directory` (every attempt of every item), newest first (a
    batch's items in their order among jobs made at once), at most `limit` (None: all), only those in `status` if
    given; and where each is in the batch, as its ledger has it. PidError (one line) when the directory is not a
    batch's."""
    try:
        bdir = BatchDir.open(os.path.abspath(os.path.expanduser(directory)))
    except ValueError as exc:
        raise PidError(str(exc)) from None
    place: dict[str, Place] = {job: (item, job == jobs[-1]) for item, jobs in bdir.ledger.items() for job in jobs}
    records = [r for r in store.batch_jobs(bdir.batch_id) if status is None or r.status == status]
    order: dict[str | None, int] = {item: n for n, item in enumerate(bdir.order)}
    records = sorted(records, key=lambda r: (-r.created_at, order.get(place.get(r.id, (None, False))[0], -1)))[:limit]
    return records, [place.get(r.id, (None, False)) for r in records]


def listed(records: list[Any], places: list[Place] | None) -> list[dict[str, Any]]:
    """What `pid list --json` prints (and pid.list_jobs returns): each record as a dict; a batch's with its item and
    whether it is the item's current job."""
    if places is None:
        return [r.to_dict() for r in records]
    return [{**r.to_dict(), "item": item, "current": current} for r, (item, current) in zip(records, places)]
