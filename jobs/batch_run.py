"""One run of a batch over its output directory: which items it submits (and how: a chunk at a time, ledger
first), which jobs it waits for (never a second job beside a live one), how it follows them (one store query per
poll for all), downloads each as it ends, cancels them when interrupted, and its summary.

It prints nothing and exits nothing: what happens goes to a Display (each item's row as it ends, the progress at
each poll, notes) and to `warn` (what is said outside the display); the summary is returned. `pid batch`
(cli/batch.py) prints those and keeps Ctrl-C's handling; pid.batch (pid/api.py) collects them.
"""
from __future__ import annotations

import os
import secrets
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

from pid import settings
from pid.endings import EXIT_CHECK_FAILED, ending_words
from pid.terminal import one_line
from pid.jobs.outage import WaitingThrough
from pid.jobs.batch import BatchDir, needs_run, release, row_for, summarize
from pid.jobs.spec import JobSpec, new_job_id
from pid.jobs.store import JobRecord
from pid.jobs.trees import remove_tree

POLL_S = 0.5                 # how often the store is read for the batch's jobs (one query for all)...
POLL_MAX_S = 2.0             # ...or, with more than 250 jobs to follow, up to this
CHUNK = 200                  # jobs per ledger sync
DOWNLOADS = 4                # artifacts downloaded at once
ROWS_EVERY_S = 2.0           # batch.jsonl is rewritten at most this often while the batch runs (and at its end)
CANCEL_WAIT_S = 90.0         # after Ctrl-C, how long the running jobs get to end before the command stops waiting
CANCELLED_NOTE = ("pid: the batch was cancelled (pid batch --cancel DIR, Batch.cancel): this run submits no more of "
                  "it; running it again resumes it")


class KeyNotKept(RuntimeError):
    """The job store refused a job's API key: the batch stops (the job would run without it)."""


@dataclass
class Progress:
    """What a display shows, recomputed from the store at each poll."""
    total: int                                   # items of the batch
    counts: dict[str, int] = field(default_factory=dict)   # by status: ended items' and the live jobs'
    running: list[tuple[str, JobRecord]] = field(default_factory=list)   # (item id, its record)
    cost: float = 0.0
    budget: float | None = None                  # --max-total-cost...
    spent: float = 0.0                           # ...and what it is held against: every job of the batch, earlier too
    ended_now: int = 0                           # items ended since this run started
    to_end: int = 0                              # items this run still waits for
    started: float = field(default_factory=time.monotonic)

    def rate(self) -> float | None:
        """Items ended per minute in this run."""
        elapsed = time.monotonic() - self.started
        return self.ended_now / elapsed * 60 if self.ended_now and elapsed > 0 else None

    def eta_s(self) -> float | None:
        rate = self.rate()
        return self.to_end / rate * 60 if rate else None


class Display(Protocol):
    """Where a following run reports: an item's batch.jsonl row as it ends, the progress at each poll, a note
    (an earlier job resubmitted, the budget spent, the local worker gone). Called from the following thread only."""
    def item_ended(self, row: dict[str, Any], progress: Progress) -> None: ...
    def update(self, progress: Progress) -> None: ...
    def note(self, text: str) -> None: ...
    def stop(self) -> None: ...


def ignore(text: str) -> None:
    """A `warn` that drops what it is told."""


@dataclass
class _Following:
    """What Run.follow keeps between its passes over the store."""
    progress: Progress
    display: Display
    downloads: ThreadPoolExecutor
    outage: WaitingThrough
    pending: dict[str, Future[dict[str, Any]]] = field(default_factory=dict)   # job id -> its download
    cancelled_at: float | None = None   # when an interrupt cancelled the jobs
    stop_seen: bool = False             # the batch's cancel mark, acted on
    budget_ended: bool = False          # the budget was spent, and the queued items cancelled
    last_rows: float = 0.0              # when batch.jsonl was last written
    began: float = field(default_factory=time.monotonic)
    workers_looked: bool = False        # whether a worker takes the batch's queues was looked at (once)


@dataclass
class Run:
    """One run over the batch directory: what it submits, waits for, downloads and records."""
    bdir: BatchDir
    store: Any
    retry_failed: bool
    specs: dict[str, JobSpec] = field(default_factory=dict)   # item id -> its spec (none with --wait DIR)
    api_key: str | None = None
    key_endpoint: str | None = None   # the key goes with the jobs whose endpoint this is (pid.config.endpoint)
    max_running: int | None = None
    local: Any = None                                         # pid.jobs.batch_setup.LocalWorkers
    warn: Callable[[str], None] = ignore                      # what is said outside the display (stderr's lines)
    tracked: dict[str, str] = field(default_factory=dict)     # job id -> item id: jobs this run waits for
    adopted: set[str] = field(default_factory=set)            # ...of which those an earlier run submitted
    watched: set[str] = field(default_factory=set)            # ...and of those, the ones live and not being
    #                                                           cancelled when adopted (a cancel then is this run's)
    stopped: bool = False                                     # the batch was cancelled as a whole meanwhile
    submitted: int = 0
    interrupted: int = 0                                      # interrupt() count (the CLI's Ctrl-C)
    let_go_by: int = 0                                        # let_go()'s signal: stop following, the jobs go on
    deadline: float | None = None                             # (time.monotonic()) stop following then, likewise
    timed_out: int = 0                                        # ...and it did: this many jobs had not ended
    stopping: bool = False                                    # follow() waits for its downloads to end

    # -- submitting --------------------------------------------------------------------------------------------
    def _key_reaches(self, spec: JobSpec) -> bool:
        from pid.config import endpoint
        return self.key_endpoint is None or endpoint(spec.api, spec.base_url) == self.key_endpoint

    def start(self) -> None:
        """Decide per item (skip, wait for its job, submit), then submit."""
        records = {r.id: r for r in self.store.batch_jobs(self.bdir.batch_id)}
        to_submit = []
        for item_id in self.bdir.order:
            if item_id not in self.specs:
                continue
            job_id = self.bdir.current_job(item_id)
            record = records.get(job_id) if job_id else None
            step = next_step(self.bdir, item_id, record, self.retry_failed)
            if step == "submit":
                to_submit.append(item_id)
            elif step in ("wait", "record") and job_id is not None and record is not None:
                self.tracked[job_id] = item_id           # wait for it, never beside it; or record how it ended first
                self.adopted.add(job_id)
                if step == "wait" and not record.cancel_requested:
                    self.watched.add(job_id)
        info = self.store.batch(self.bdir.batch_id) if to_submit else None
        if info is not None and info.exhausted:   # each would end batch_budget unrun, its item's work before it kept
            n = len(to_submit)
            self.warn(f"pid: the batch's --max-total-cost (${info.max_total_cost:g}) is spent (${info.spent:.4f}): "
                      f"{n} item{'s' if n != 1 else ''} not submitted (a higher --max-total-cost runs them)")
            to_submit = []
        elif not to_submit and not self.tracked:
            self.warn(nothing_to_do([self.bdir.rows.get(i) for i in self.bdir.order if i in self.specs]))
        again = sorted({_ended(self.bdir.rows[i]) for i in to_submit if self.bdir.rows.get(i)})
        if again:
            n = sum(1 for i in to_submit if self.bdir.rows.get(i))
            self.warn(f"pid: {n} item{'s' if n != 1 else ''} whose earlier job ended {' or '.join(again)}: submitted "
                      "again")
        self.submit(to_submit)

    def submit(self, item_ids: list[str]) -> None:
        """Ledger first (synced), then the jobs, a chunk at a time: created in one store operation, and published
        (one broker connection) unless --max-running holds them back (parked: jobs/batch_budget.py)."""
        room = None
        if self.max_running is not None:
            info = self.store.batch(self.bdir.batch_id)
            records = {r.id: r for r in self.store.batch_jobs(self.bdir.batch_id)}
            waiting = sum(1 for j in self.tracked if j in records and records[j].status == "queued"
                          and records[j].dispatched_at is not None)
            room = max(0, self.max_running - (info.running if info else 0) - waiting)
        for start in range(0, len(item_ids), CHUNK):
            if self.bdir.cancelled():   # cancelled as a whole (Batch.cancel, --cancel DIR): no more of it
                if not self.stopped:
                    self.warn(CANCELLED_NOTE)
                self.stopped = True
                return
            chunk = [(item_id, _job_spec(self.specs[item_id], self.bdir.batch_id)) for item_id in
                     item_ids[start:start + CHUNK]]
            self.bdir.record_jobs([(item_id, spec.id) for item_id, spec in chunk])
            go = chunk if room is None else chunk[:room]
            room = None if room is None else room - len(go)
            for item_id, spec in chunk:   # tracked before they exist: an interrupt at any point cancels them
                self.tracked[spec.id] = item_id
            self.store.create_many([spec for _, spec in go], dispatched=True)
            self.store.create_many([spec for _, spec in chunk[len(go):]], dispatched=False)
            for item_id, spec in chunk:
                if self.api_key and self._key_reaches(spec) and not self.store.set_secret(spec.id, self.api_key):
                    raise KeyNotKept(f"the job store did not keep job {spec.id}'s API key")
            self.submitted += len(chunk)
            self._publish([spec for _, spec in go])

    def _publish(self, specs: list[JobSpec]) -> None:
        """Each job's message (its id), over one connection. A publish that fails leaves it and the rest to the
        workers' reconcilers, which publish what the store says was not (a warning, once)."""
        from pid.jobs.dispatch import publish
        sent, error = publish(self.store, [(spec.id, spec.queue) for spec in specs])
        if error is None:
            return
        for left in specs[sent:]:
            self.store.mark_undispatched(left.id, f"{type(error).__name__}: {error}")
        self.warn(f"pid: warning: the broker refused job {specs[sent].id} ({error}); {len(specs) - sent} job(s) "
                  "wait for a worker's reconciler to queue them")

    # -- following ---------------------------------------------------------------------------------------------

    def follow_existing(self, display: Display) -> dict[str, Any]:
        """--wait DIR: the jobs the ledger names that have not been recorded as ended, followed."""
        self.collect_existing()
        return self.follow(display)

    def collect_existing(self) -> None:
        """Track the jobs the ledger names that have not been recorded as ended."""
        records = {r.id: r for r in self.store.batch_jobs(self.bdir.batch_id)}
        for item_id in self.bdir.order:
            job_id = self.bdir.current_job(item_id)
            row = self.bdir.rows.get(item_id)
            if job_id and job_id in records and (row is None or row.get("job_id") != job_id):
                self.tracked[job_id] = item_id

    def follow(self, display: Display) -> dict[str, Any]:
        """Wait for every tracked job, recording each as it ends (told to `display`), and return the summary
        (summary.json's). After interrupt(): the jobs are cancelled, and waited for CANCEL_WAIT_S at most (or until
        a second interrupt()); `tracked` holds those still ending. Whatever stops it (KeyboardInterrupt
        included), batch.jsonl keeps the items that ended; stopped early, the downloads not begun are dropped (a
        rerun makes them), and a KeyboardInterrupt cancels the jobs first, then waits for the downloads begun."""
        f = _Following(Progress(total=len(self.bdir.order)), display,
                       ThreadPoolExecutor(DOWNLOADS, thread_name_prefix="pid-batch-download"),
                       WaitingThrough(lambda text: display.note(f"pid: {text}")))
        ended = False
        try:
            while self.tracked or f.pending:
                if self.interrupted > 1 and f.outage.since is not None:
                    break   # (the store is down: a second Ctrl-C stops waiting for it)
                try:
                    if not self._follow_pass(f):
                        break
                    f.outage.reached()
                except Exception as exc:   # the store unreachable (a Redis restarting): waited through, a while
                    if not f.outage.bear(exc):
                        raise
                if self.deadline is not None and time.monotonic() >= self.deadline:   # (after a pass, and
                    self.timed_out = sum(job_id not in f.pending for job_id in self.tracked)   # the downloads of
                    if self.timed_out:                                             # what had ended by then)
                        break
                if self.tracked or f.pending:   # one query for all: less often for thousands of jobs
                    time.sleep(min(POLL_MAX_S, max(POLL_S, len(self.tracked) / 500)))
            ended = not self.interrupted and not self.let_go_by and not self.timed_out
        except KeyboardInterrupt:   # (pid.batch's): the jobs cancelled before any wait for the downloads
            self.cancel_tracked(note=display.note)
            raise
        finally:
            self.stopping = True   # (from here a further Ctrl-C of `pid batch` raises: cli/batch_run.py)
            try:   # stopped: the downloads not begun are dropped (a rerun fetches those items again)
                f.downloads.shutdown(wait=True, cancel_futures=not ended)
            finally:
                display.stop()
                self.bdir.write_rows()
        return self.summary()

    def _follow_pass(self, f: _Following) -> bool:
        """One look at the store for all the batch's jobs: stops acted on, ended jobs downloaded and recorded, the
        budget and the local workers checked, the display updated. False: stop following (interrupted, and the
        jobs had their time to end)."""
        if self.let_go_by:
            return False
        records = self._records()
        if self.interrupted and f.cancelled_at is None:
            f.cancelled_at = time.monotonic()
            self._cancel_all(records, f.display)
            records = self._records()
        if not f.stop_seen and self.bdir.cancelled():   # the batch cancelled elsewhere: what this run
            f.stop_seen = True                          # submitted since goes too, and none again
            if not self.stopped and self.specs:   # (a run that submits nothing has nothing to say)
                f.display.note(CANCELLED_NOTE)
            self.stopped = True
            self.cancel_tracked(records, f.display.note)
            records = self._records()
        if f.cancelled_at is not None and (self.interrupted > 1 or time.monotonic() - f.cancelled_at > CANCEL_WAIT_S):
            return False
        self._download_ended(records, f)
        self._record_downloaded(records, f)
        if not f.budget_ended:
            self._check_budget(f)
        if self.local is not None and not self.local.alive() and self.tracked:
            f.display.note(f"pid: the local worker stopped (see {self.local.log_path})")
            self.local = None
        if self.local is None and not f.workers_looked and \
                time.monotonic() - f.began >= settings.NO_WORKER_NOTICE_S.get():
            f.workers_looked = True
            self._look_for_workers(records, f)
        count(f.progress, self.bdir, records, self.tracked)
        f.display.update(f.progress)
        if time.monotonic() - f.last_rows >= ROWS_EVERY_S:
            self.bdir.write_rows()
            f.last_rows = time.monotonic()
        return True

    def _look_for_workers(self, records: dict[str, JobRecord], f: _Following) -> None:
        """Once, a while into following: the queues of the jobs still queued that no live worker consumes are said
        (a misnamed queue, or no worker started, had the batch wait in silence)."""
        from pid.jobs.workers import no_worker, unserved_queues
        queued = [r for job_id in self.tracked if (r := records.get(job_id)) is not None and r.status == "queued"]
        for queue in unserved_queues(self.store, {r.spec.queue for r in queued}):
            waiting = sum(1 for r in queued if r.spec.queue == queue)
            f.display.note(f"pid: {waiting} item(s) still queued after {time.monotonic() - f.began:.0f}s: "
                           f"{no_worker(queue)}")

    def _records(self) -> dict[str, JobRecord]:
        return {r.id: r for r in self.store.batch_jobs(self.bdir.batch_id)}

    def _download_ended(self, records: dict[str, JobRecord], f: _Following) -> None:
        """Each tracked job that ended gets its download begun; one gone from the store (expired: it never ended
        for this batch) is submitted again."""
        for job_id, item_id in list(self.tracked.items()):
            record = records.get(job_id)
            if record is None:
                del self.tracked[job_id]
                if not self.interrupted and not self.stopped and item_id in self.specs:
                    self.submit([item_id])
            elif record.terminal and job_id not in f.pending:
                f.pending[job_id] = f.downloads.submit(self._finish_item, job_id, item_id, record)

    def _record_downloaded(self, records: dict[str, JobRecord], f: _Following) -> None:
        """Each finished download becomes its item's row (and is shown); an earlier run's job that was cancelled
        (or failed, with --retry-failed) is submitted again."""
        for job_id, future in list(f.pending.items()):
            if not future.done():
                continue
            del f.pending[job_id]
            row = future.result()   # (a store's outage raised here: the next poll downloads it again)
            item_id = self.tracked.pop(job_id)
            self.bdir.rows[item_id] = row
            cancelled_here = job_id in self.watched and row.get("status") == "cancelled"
            again = (job_id in self.adopted and not self.interrupted and not self.stopped and not cancelled_here
                     and item_id in self.specs and needs_run(row, self.retry_failed)
                     and row.get("exit_reason") != "batch_budget")
            if not again:
                f.progress.ended_now += 1
            count(f.progress, self.bdir, records, self.tracked)
            if again:   # an earlier run's ending (a cancel it left still ending): said as such, not as this run's
                f.display.note(f"pid: {one_line(item_id)}: its earlier job ended "
                               f"{ending_words(row['status'], row['exit_reason'])}: submitted again")
                self.submit([item_id])
            else:
                f.display.item_ended(row, f.progress)

    def _check_budget(self, f: _Following) -> None:
        """The batch's cost budget: once spent, its queued items are cancelled (once)."""
        info = self.store.batch(self.bdir.batch_id)
        f.progress.budget = info.max_total_cost if info else None
        f.progress.spent = info.spent if info else 0.0
        if info is not None and info.exhausted:
            from pid.jobs.batch_budget import budget_note, end_queued
            f.budget_ended = True
            if end_queued(self.store, self.bdir.batch_id, budget_note(info)):
                f.display.note(f"pid: {budget_note(info)}: the queued items are cancelled")

    def close(self) -> None:
        """Stop the local workers (`--workers N`), if any: a job still running goes back to the queue. Then let
        the batch directory go (another run may follow it)."""
        try:
            if self.local is not None:
                self.local.stop()
                self.local = None
        finally:
            release(self.bdir.lock)
            self.bdir.lock = None

    def let_go(self, signum: int) -> None:
        """Stop following at the next pass (safe from a signal handler): the jobs are not cancelled, they go on."""
        self.let_go_by = signum

    def interrupt(self) -> int:
        """Stop the batch (safe from a signal handler or another thread): the first call has follow() cancel the
        jobs it waits for, the second stops it waiting for them. Returns how many calls so far."""
        self.interrupted += 1
        return self.interrupted

    def _cancel_all(self, records: dict[str, Any], display: Display) -> None:
        self.cancel_tracked(records, display.note)

    def cancel_tracked(self, records: dict[str, Any] | None = None, note: Any = None) -> None:
        """Cancel every job this run waits for that has not ended (queued ones end now, running ones through
        their workers)."""
        from pid.jobs.sweep import cancel_job
        for job_id in list(self.tracked):
            record = records.get(job_id) if records is not None else self.store.get(job_id)
            if record is not None and not record.terminal:
                try:
                    cancel_job(self.store, job_id)
                except Exception as exc:
                    (note or self.warn)(f"pid: cancelling job {job_id}: {exc}")

    def _finish_item(self, job_id: str, item_id: str, record: Any) -> dict[str, Any]:
        """An ended job: its result.json and artifacts from the store into DIR/<item id>/; its batch.jsonl row."""
        from pid.jobs.artifact_store import DownloadError, download, read_result
        from pid.jobs.submission import RESULT_GRACE_S
        note = None
        try:
            result = read_result(self.store, job_id, wait_s=RESULT_GRACE_S)
        except DownloadError as exc:
            result, note = None, str(exc)
        if result is None:
            result = {"id": job_id, "status": record.status, "exit_reason": record.exit_reason,
                      "error": record.error or note or "no result.json in the job store", "turns": record.turns,
                      "tool_calls": record.tool_calls, "usage": record.total_usage, "duration_s": record.duration_s}
        else:
            fresh = os.path.join(self.bdir.path, f".download-{item_id}-{secrets.token_hex(3)}")
            try:
                download(self.store, job_id, fresh)
                self.bdir.replace_item_dir(item_id, fresh)
            except (DownloadError, OSError) as exc:
                remove_tree(fresh)
                result.setdefault("error", f"artifacts not downloaded: {exc}")
        remove_tree(os.path.join(self.bdir.jobs_dir, job_id))
        return row_for(item_id, job_id, result, bool(record.spec.check))

    def summary(self) -> dict[str, Any]:
        """The batch's summary from the rows recorded so far (its budget's figures with it), written to
        summary.json; its "exit_code" is the worst item's."""
        rows = [self.bdir.rows[i] for i in self.bdir.order if i in self.bdir.rows]
        summary = {"batch": self.bdir.batch_id, **summarize(rows, len(self.bdir.order))}
        info = self.store.batch(self.bdir.batch_id)
        if info is not None:
            summary["budget"] = {"max_total_cost": info.max_total_cost, "spent": info.spent,
                                 "max_running": info.max_running}
            # cost.total is the items' latest jobs'; a rerun's earlier jobs and a job's earlier attempts were paid too
            summary["cost"]["all_jobs"] = round(info.spent, 6)
        self.bdir.write_summary(summary)
        return summary


def _job_spec(template: JobSpec, batch_id: str) -> JobSpec:
    """A new job for an item: its spec, with a fresh id (longer than submit's: thousands are made per second)."""
    return replace(template, id=new_job_id() + secrets.token_hex(2), batch=batch_id)


def next_step(bdir: BatchDir, item_id: str, record: Any, retry_failed: bool) -> str:
    """What a run of the batch does for an item, given its current job's record (None: no job, or none in the
    store): "submit"; "wait" (its job is queued or running); "record" (its job ended while no run watched: its row
    is written first, and a later run goes on from it); or "skip"."""
    job_id = bdir.current_job(item_id)
    row = bdir.rows.get(item_id)
    if job_id is None or record is None:
        return "submit" if needs_run(row, retry_failed) else "skip"
    if not record.terminal:
        return "wait"
    if row is None or row.get("job_id") != job_id:
        return "record"
    return "submit" if needs_run(row, retry_failed) else "skip"


def _ended(row: dict[str, Any]) -> str:
    """How an ended item's job ended, in a few words: its status, or that its check failed (its status then is
    `completed`, which a rerun does not run again)."""
    if row.get("exit_code") == EXIT_CHECK_FAILED:
        return "with a failed check"
    return "at a limit" if row.get("status") == "limit" else str(row.get("status"))


def nothing_to_do(rows: list[dict[str, Any] | None]) -> str:
    """What a rerun with nothing to run says: how many items it skipped, and why."""
    ended = [row for row in rows if row is not None]
    completed = sum(1 for row in ended if row.get("exit_code") == 0)
    check_failed = sum(1 for row in ended if row.get("exit_code") == EXIT_CHECK_FAILED)
    others = len(rows) - completed - check_failed
    skipped = [f"{count} {what}" for count, what in ((completed, "completed"),
                                                      (check_failed, "completed whose check failed"),
                                                      (others, "failed or hit a limit")) if count] or ["0 items"]
    again = " (--retry-failed runs them again)" if check_failed or others else ""
    return f"nothing to do: skipped {', '.join(skipped)}{again}"


def item_state(bdir: BatchDir, item_id: str, records: dict[str, Any],
               followed: bool) -> tuple[str, Any, dict[str, Any] | None]:
    """An item's status (by its row once ended, else by its current job's record), that record and that row."""
    job_id = bdir.current_job(item_id)
    record = records.get(job_id) if job_id else None
    row = bdir.rows.get(item_id)
    if followed and record is not None:
        status = record.status if not record.terminal else "ending"
    elif row is not None and (record is None or row.get("job_id") == job_id):
        status = str(row.get("status"))
    elif record is not None:   # its current job, not followed here (--status DIR): as the store has it
        status = record.status
    else:
        status = "not submitted"
    return status, record, row


def count(progress: Progress, bdir: BatchDir, records: dict[str, Any], tracked: dict[str, str]) -> None:
    """The display's numbers: ended items by their row, the others by their job's status now."""
    counts: dict[str, int] = {}
    running = []
    cost = 0.0
    live_items = set(tracked.values())
    for item_id in bdir.order:
        status, record, row = item_state(bdir, item_id, records, item_id in live_items)
        if item_id in live_items and record is not None and record.status == "running":
            running.append((item_id, record))
        counts[status] = counts.get(status, 0) + 1
        if record is not None:
            cost += float(record.total_usage.get("cost") or 0)
        elif row is not None:
            cost += float(row.get("cost") or 0)
    progress.counts, progress.running, progress.cost = counts, running, cost
    progress.to_end = len(tracked)


