"""A batch's shared limits, on the worker's side: its budget (`pid batch --max-total-cost`) and its running limit
(`--max-running`), both kept in the job store so that they hold across every worker and without the client.

Each model call of a batch's job adds its cost to the batch (atomically, in the store) and each model call first
asks whether the budget is spent: so once it is, every running job makes at most the one call it was making, and
stops before its next one with exit reason `batch_budget`. The job that spends the last of it also ends the batch's
queued jobs (`batch_budget` too). A job the store refuses to start because its batch already runs `max_running`
jobs waits, undispatched ("parked"); when one of the batch's jobs ends, its worker dispatches parked ones for the
free slots (and the reconciler does, every few seconds, what a lost worker could not).
"""
from __future__ import annotations

import logging
from typing import Any

from pid import events as ev
from pid.endings import ExitReason
from pid.messages import AssistantMessage
from pid.jobs.store import BatchInfo, Batches, JobRecord, Store

log = logging.getLogger("pid.worker")

PARKED = "waiting for a free slot of its batch (--max-running)"


def budget_note(info: BatchInfo) -> str:
    return f"the batch's budget is spent (${info.spent:.4f} of --max-total-cost ${info.max_total_cost or 0:.4f})"


class BatchBudget:
    """One running job's link to its batch's budget: a sink that adds each model call's cost, and the gate the
    agent asks before each call. A store that fails costs the budget's check for that call, never the job."""

    def __init__(self, store: Store, batch_id: str) -> None:
        self.store, self.batch_id = store, batch_id
        self._spent: BatchInfo | None = None

    def sink(self, inner: ev.EventSink) -> ev.EventSink:
        def both(event: ev.Event) -> None:
            if isinstance(event, ev.MessageEnd) and isinstance(event.message, AssistantMessage):
                self._add(event.message.usage.cost.total)
            inner(event)
        return both

    def _add(self, cost: float) -> None:
        if cost <= 0:
            return
        try:
            info = self.store.add_batch_spend(self.batch_id, cost)
        except Exception:
            log.exception("batch %s: adding a model call's cost", self.batch_id)
            return
        if info is not None and info.exhausted and not (self._spent and self._spent.exhausted):
            self._spent = info
            end_queued(self.store, self.batch_id, budget_note(info))

    def gate(self) -> tuple[ExitReason, str] | None:
        try:
            info = self.store.batch(self.batch_id)
        except Exception:
            log.exception("batch %s: reading its budget", self.batch_id)
            return None
        if info is not None and info.exhausted:
            return "batch_budget", budget_note(info)
        return None


def end_queued(store: Store, batch_id: str, note: str) -> list[str]:
    """The batch's queued jobs end `batch_budget` (each with its result.json); returns their ids."""
    from pid.jobs.sweep import write_unrun_result
    ended = []
    for record in store.batch_jobs(batch_id):
        if record.status == "queued" and store.finish_if_queued(record.id, "batch_budget"):
            write_unrun_result(record.spec, "batch_budget", note, store=store)
            ended.append(record.id)
    return ended


def refused(store: Store, record: JobRecord) -> str | None:
    """A batch's queued job the store would not let start: end it (budget spent) or park it (batch full).
    Returns what was done, or None when the refusal was not the batch's doing."""
    if record.status != "queued" or record.cancel_requested or not record.spec.batch:
        return None
    info = store.batch(record.spec.batch)
    if info is None:
        return None
    if info.exhausted:
        from pid.jobs.sweep import write_unrun_result
        if store.finish_if_queued(record.id, "batch_budget"):
            write_unrun_result(record.spec, "batch_budget", budget_note(info), store=store)
        return "batch_budget"
    if info.max_running is not None and info.running >= info.max_running:
        store.mark_undispatched(record.id, PARKED, parked=True)
        return "parked"
    return None


IN_FLIGHT_S = 60.0   # a job dispatched this recently and not yet taken holds a slot of its batch (its message waits)


def room(store: Batches, batch_id: str) -> int | None:
    """How many more of the batch's jobs may be dispatched now (None: no limit): its free slots, less the jobs
    whose message is on its way to a worker."""
    info = store.batch(batch_id)
    if info is None or info.max_running is None:
        return None
    since = store.now() - IN_FLIGHT_S
    in_flight = sum(1 for r in store.batch_jobs(batch_id) if r.status == "queued" and r.dispatched_at is not None
                    and r.dispatched_at >= since)
    return max(0, info.max_running - info.running - in_flight)


def wake_parked(store: Store, batch_id: str) -> list[str]:
    """Dispatch the batch's parked jobs for its free slots (once each, whoever else does it too)."""
    free = room(store, batch_id)
    if free == 0:
        return []
    from pid.jobs.dispatch import dispatch
    woken: list[str] = []
    for record in store.batch_jobs(batch_id):
        if free is not None and len(woken) >= free:
            break
        if record.status == "queued" and record.dispatched_at is None and not record.cancel_requested:
            try:
                if dispatch(record.id, store=store, previous=None, reconcile=True):
                    woken.append(record.id)
            except Exception as exc:
                log.warning("batch %s: dispatching a waiting job: %s", batch_id, exc)
                break
    return woken


def attach(store: Store, record: JobRecord, inner: ev.EventSink) -> tuple[ev.EventSink, Any]:
    """A job's sink and gate: with its batch's budget when it belongs to one that has a budget."""
    if not record.spec.batch:
        return inner, None
    budget = BatchBudget(store, record.spec.batch)
    return budget.sink(inner), budget.gate
