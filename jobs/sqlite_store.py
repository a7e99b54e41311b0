"""The SQLite job store: one file under PID_HOME, no server, safe across the worker's processes on one machine, and
across fork(): a fork waits until no thread of the process is inside SQLite. The contract it serves is jobs/store.py's
`Store`; JobStore is that contract's roles, one class each, over one connection base (SqliteDb).
"""
from __future__ import annotations

import builtins
import hashlib
import json
import os
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, BinaryIO, Iterator

from pid.endings import ExitReason, status_of
from pid.jobs.spec import DEFAULT_QUEUE, JobSpec
from pid.jobs.store import (ALIVE_WITHIN_S, ARTIFACT_LIMIT, BLOB_CHUNK, EVENTS_KEPT, BatchInfo, BlobMissing,
                            Capped, Controls, JobRecord, StoreUnavailable, WorkerBeat, _policy, _pool, _queues,
                            blob_from_file, blob_hex, check_artifact_name, retention_s, sum_usage)

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY,
  spec TEXT NOT NULL,
  status TEXT NOT NULL,            -- queued | running | one of pid.endings.STATUSES
  owner TEXT,                      -- the worker process holding the lease
  lease_until REAL,
  attempts INTEGER NOT NULL DEFAULT 0,
  cancel_requested INTEGER NOT NULL DEFAULT 0,
  paused INTEGER NOT NULL DEFAULT 0,
  turns INTEGER NOT NULL DEFAULT 0,
  tool_calls INTEGER NOT NULL DEFAULT 0,
  exit_reason TEXT,
  error TEXT,
  created_at REAL NOT NULL,
  started_at REAL,
  finished_at REAL,
  kind TEXT NOT NULL DEFAULT 'worker', -- worker (submitted) | run (a foreground `pid run`: never dispatched again)
  usage TEXT,                      -- this attempt's usage so far, result.json's shape (JSON)
  earlier TEXT,                    -- the earlier attempts' counts: [{attempt, turns, tool_calls, usage}] (JSON)
  activity TEXT,                   -- what the job is doing now (turn, running tool)
  last_tool TEXT,                  -- the last tool call that finished
  updated_at REAL,                 -- when progress was last recorded
  claimed_at REAL,                 -- when the running attempt was claimed (its owner process started before)
  handbacks INTEGER NOT NULL DEFAULT 0,  -- attempts handed back by a stopping worker (not lost: not counted as such)
  dispatched_at REAL,              -- when its message was last published; NULL: it must be (re)dispatched
  dispatch_error TEXT,             -- why the last publish failed
  undispatched_since REAL          -- since when it has waited for a publish that works
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs(status);
CREATE TABLE IF NOT EXISTS workers (
  node TEXT PRIMARY KEY,           -- Celery's node name, unique per worker process
  host TEXT NOT NULL,
  pid INTEGER NOT NULL,
  boot_id TEXT,                    -- tells a rebooted host from a live one
  concurrency INTEGER NOT NULL,
  running INTEGER NOT NULL,
  free_since REAL,                 -- since when it has had a free slot and taken jobs; NULL: busy or stopping
  started_at REAL NOT NULL,
  beat_at REAL NOT NULL,
  queues TEXT,                     -- the queues it consumes, comma-separated
  policy TEXT,                     -- the rules it admits jobs by, JSON (jobs/policy.py); NULL: everything
  identity TEXT,                   -- its process's boot, pid namespace and start time (worker/control.py)
  stopped_at REAL,                 -- when it stopped cleanly; NULL: it has not (alive, or killed: silent)
  alarm TEXT,                      -- what went badly wrong that its user must know (jobs/store_watch.py)
  pool TEXT,                       -- its warm pool, JSON: per image, sandboxes ready and their memory
  silent_since REAL,               -- its last silence, from the same process: its beat before (jobs/store.py
  resumed_at REAL                  -- WorkerBeat), and its beat after
);
CREATE TABLE IF NOT EXISTS inbox (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  kind TEXT NOT NULL,              -- steer | follow_up
  text TEXT NOT NULL,
  delivered INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS inbox_job ON inbox(job_id, delivered);
CREATE TABLE IF NOT EXISTS events (
  job_id TEXT NOT NULL,
  seq INTEGER NOT NULL,            -- 1, 2, ... per job; the newest EVENTS_KEPT are kept
  data TEXT NOT NULL,              -- the event (JSON)
  PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS artifacts (
  job_id TEXT NOT NULL,
  name TEXT NOT NULL,
  digest TEXT NOT NULL,            -- its content: a blob
  size INTEGER NOT NULL,
  PRIMARY KEY (job_id, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS secrets (
  job_id TEXT PRIMARY KEY,         -- a job's API key, for the life of the job only
  api_key TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
  id TEXT PRIMARY KEY,             -- a `pid batch` (JobSpec.batch): what its jobs share across every worker
  max_total_cost REAL,             -- USD for all its jobs together; NULL: no limit
  max_running INTEGER,             -- its jobs running at once at most; NULL: no limit
  spent REAL NOT NULL DEFAULT 0,   -- USD its jobs have spent (each model call adds its cost)
  created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS blob_pins (
  digest TEXT PRIMARY KEY          -- blobs that prune() keeps whatever their age
);
CREATE TRIGGER IF NOT EXISTS jobs_end_forget_secret AFTER UPDATE OF status ON jobs
  WHEN NEW.status NOT IN ('queued', 'running')
  BEGIN DELETE FROM secrets WHERE job_id = NEW.id; END;
"""

# Columns added after the first release: a store made by an older pid gets them on open.
ADDED_COLUMNS = {"kind": "TEXT NOT NULL DEFAULT 'worker'", "usage": "TEXT", "earlier": "TEXT", "activity": "TEXT",
                 "last_tool": "TEXT", "updated_at": "REAL", "claimed_at": "REAL",
                 "handbacks": "INTEGER NOT NULL DEFAULT 0", "dispatched_at": "REAL", "dispatch_error": "TEXT",
                 "undispatched_since": "REAL", "pinned": "INTEGER NOT NULL DEFAULT 0",
                 "check_result": "TEXT",   # result.json's `check` (JSON), once the job's check ran
                 "batch": "TEXT",
                 "rid": "TEXT"}   # the id reversed: a suffix of ids is a prefix of these (indexed)
WORKER_COLUMNS = {"queues": "TEXT", "policy": "TEXT", "identity": "TEXT", "stopped_at": "REAL", "alarm": "TEXT",
                  "pool": "TEXT", "silent_since": "REAL", "resumed_at": "REAL"}


# SQLite's state must not be copied mid-operation into a forked child (its mutexes, a half-done write): every
# store operation holds this lock, and a fork in this process waits for it.
_fork_guard = threading.RLock()


_inherited: list[sqlite3.Connection] = []


def _fresh_guard_in_child() -> None:
    global _fork_guard
    _fork_guard = threading.RLock()


os.register_at_fork(before=lambda: _fork_guard.acquire(), after_in_parent=lambda: _fork_guard.release(),
                    after_in_child=_fresh_guard_in_child)


def _wal(db: sqlite3.Connection) -> None:
    """WAL mode. Switching a new database to it takes an exclusive lock and fails at once ("database is locked"),
    without waiting, when another process opens the same new file at that moment (pid run and its own sweep do)."""
    for attempt in range(50):
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == 49:
                raise
            time.sleep(0.02)


class SqliteDb:
    """The database and its blob folder: a connection per operation (a kept one per thread for frequent reads)."""

    def __init__(self, path: str, retention: float | None = None) -> None:
        self.path = path
        self.blob_dir = os.path.join(os.path.dirname(os.path.abspath(path)), "blobs")
        self.retention = retention          # None: PID_RETENTION, read by prune()
        self.events_kept = EVENTS_KEPT
        self._local = threading.local()
        self._kept: list[tuple[int, threading.Thread, sqlite3.Connection]] = []   # (pid, thread, its reader)
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._migrate()
        except OSError as exc:
            raise StoreUnavailable(f"cannot make {os.path.dirname(path)}: {exc.strerror or exc}") from None
        except sqlite3.OperationalError as exc:
            if "unable to open" not in str(exc):
                raise
            raise StoreUnavailable(str(exc)) from None

    def _migrate(self) -> None:
        """The schema, with the columns added since a store was first made."""
        with self._db() as db:
            db.executescript(SCHEMA)
            for table, added in (("jobs", ADDED_COLUMNS), ("workers", WORKER_COLUMNS)):
                have = {row["name"] for row in db.execute(f"PRAGMA table_info({table})")}
                for name, decl in added.items():
                    if name not in have:
                        try:
                            db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")
                        except sqlite3.OperationalError as exc:  # another process added it first
                            if "duplicate column" not in str(exc):
                                raise
            db.execute("CREATE INDEX IF NOT EXISTS jobs_batch ON jobs(batch)")
            db.execute("CREATE INDEX IF NOT EXISTS jobs_rid ON jobs(rid)")
            missing = db.execute("SELECT id FROM jobs WHERE rid IS NULL").fetchall()   # jobs made before rid
            if missing:
                db.executemany("UPDATE jobs SET rid = ? WHERE id = ?", [(r["id"][::-1], r["id"]) for r in missing])

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with _fork_guard:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            try:
                _wal(db)
                db.execute("PRAGMA busy_timeout=30000")
                db.row_factory = sqlite3.Row
                yield db
            finally:
                db.close()

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        """A connection kept by this thread for frequent reads (a running job's control polling): opening one costs
        more than the read. One inherited across a fork is never used (nor closed) by the child."""
        with _fork_guard:
            held = getattr(self._local, "db", None)
            if held is not None and held[0] != os.getpid():
                _inherited.append(held[1])   # kept from garbage collection: closing it here could disturb the parent
                held = None
            if held is None:
                db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
                db.execute("PRAGMA busy_timeout=30000")
                db.row_factory = sqlite3.Row
                held = self._local.db = (os.getpid(), db)
                self._keep(db)
            try:
                yield held[1]
            except sqlite3.Error:
                self._local.db = None
                held[1].close()
                self._kept = [kept for kept in self._kept if kept[2] is not held[1]]
                raise

    def _keep(self, db: sqlite3.Connection) -> None:
        """Note this thread's new reader, and close those of this process's threads that have ended: a connection
        is in a reference cycle (its statement cache), so only a garbage collection would close it, and a worker
        held dozens open, one per finished job. (Under _fork_guard; a parent's are never this child's to close.)"""
        me, alive = os.getpid(), []
        for kept in self._kept:
            if kept[0] != me:
                _inherited.append(kept[2])   # (as _reader keeps them)
            elif kept[1].is_alive():
                alive.append(kept)
            else:
                kept[2].close()
        self._kept = [*alive, (me, threading.current_thread(), db)]

    def now(self) -> float:
        """The store's clock: this machine's."""
        return time.time()


class SqliteRecords(SqliteDb):
    """A job's row: made, read, listed, and what a client asks of it (cancel, pause, a message). (JobRecords)"""

    def create(self, spec: JobSpec, kind: str = "worker") -> JobRecord:
        """A queued job, not yet dispatched. kind "run" is a foreground `pid run`: its process is its only worker."""
        assert kind in ("worker", "run")
        now = time.time()
        with self._db() as db:
            db.execute("INSERT INTO jobs (id, spec, status, created_at, kind, undispatched_since, batch, rid) "
                       "VALUES (?, ?, 'queued', ?, ?, ?, ?, ?)",
                       (spec.id, json.dumps(spec.to_dict()), now, kind, now, spec.batch, spec.id[::-1]))
        record = self.get(spec.id)
        assert record is not None
        return record

    def get(self, job_id: str) -> JobRecord | None:
        with self._db() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _record(row) if row else None

    def list(self, limit: int = 50, status: str | None = None) -> list[JobRecord]:
        """Newest first; only jobs in `status` when given."""
        where, args = ("WHERE status = ?", [status]) if status else ("", [])
        with self._db() as db:
            rows = db.execute(f"SELECT * FROM jobs {where} ORDER BY created_at DESC LIMIT ?", [*args, limit]).fetchall()
        return [_record(r) for r in rows]

    def ids_ending(self, suffix: str, limit: int = 10) -> "builtins.list[str]":
        """The ids of jobs that end with `suffix`, at most `limit` of them (in no particular order): one range read
        of the reversed ids' index, as what people type is the end of an id."""
        if not suffix:
            return []
        low, high = suffix[::-1], suffix[::-1][:-1] + chr(ord(suffix[0]) + 1)
        with self._db() as db:
            rows = db.execute("SELECT id FROM jobs WHERE rid >= ? AND rid < ? LIMIT ?",
                              (low, high, limit)).fetchall()
        return [r["id"] for r in rows]

    def request_cancel(self, job_id: str) -> str | None:
        """Ask for a cancel. A queued job is cancelled on the spot; a running one by its worker. Returns the status."""
        with self._db() as db:
            db.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND status IN ('queued', 'running')",
                       (job_id,))
        self.finish_if_queued(job_id, "cancelled")
        record = self.get(job_id)
        return record.status if record else None

    def finish_if_queued(self, job_id: str, exit_reason: ExitReason, error: str | None = None) -> bool:
        with self._db() as db:
            return db.execute("UPDATE jobs SET status = ?, exit_reason = ?, error = ?, finished_at = ? "
                              "WHERE id = ? AND status = 'queued'",
                              (status_of(exit_reason), exit_reason, error, time.time(), job_id)).rowcount == 1

    def set_paused(self, job_id: str, paused: bool) -> bool:
        with self._db() as db:
            return db.execute("UPDATE jobs SET paused = ? WHERE id = ? AND status IN ('queued', 'running')",
                              (int(paused), job_id)).rowcount == 1

    def post(self, job_id: str, kind: str, text: str) -> bool:
        """Queue a steering or follow-up message for a queued or running job."""
        assert kind in ("steer", "follow_up")
        with self._db() as db:
            row = db.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if not row or row["status"] not in ("queued", "running"):
                return False
            db.execute("INSERT INTO inbox (job_id, kind, text) VALUES (?, ?, ?)", (job_id, kind, text))
            return True

    def pin_job(self, job_id: str) -> bool:
        """Keep this job (record, events, artifacts and their blobs) past the retention period."""
        with self._db() as db:
            return db.execute("UPDATE jobs SET pinned = 1 WHERE id = ?", (job_id,)).rowcount == 1


class SqliteLeases(SqliteDb):
    """A worker's hold on a job it runs: the claim, its renewal and progress, the end, a hand-back. (Leases)"""

    def claim(self, job_id: str, owner: str, lease_s: float) -> bool:
        """Take the job if it is queued, or running under a lapsed lease. Exactly one claimer wins.

        A job of a batch is refused (it stays queued) while its batch runs `max_running` others or has spent its
        budget. Taking up a job that ran before keeps that attempt's counts (turns, tool calls, usage) in
        `earlier`."""
        now = time.time()
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                won = _take(db, job_id, owner, now, lease_s)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return won

    def renew(self, job_id: str, owner: str, lease_s: float) -> bool:
        with self._db() as db:
            cur = db.execute("UPDATE jobs SET lease_until = ? WHERE id = ? AND owner = ? AND status = 'running'",
                             (time.time() + lease_s, job_id, owner))
            return cur.rowcount == 1

    def progress(self, job_id: str, owner: str, turns: int, tool_calls: int, usage: dict[str, Any] | None = None,
                 activity: str | None = None, last_tool: str | None = None, lease_s: float | None = None) -> bool:
        """The running attempt's counts so far, so that a job stopped cold still has true ones; with lease_s, the
        lease renewed in the same write. Lease holder only."""
        now = time.time()
        with self._db() as db:
            return db.execute(
                "UPDATE jobs SET turns = ?, tool_calls = ?, usage = COALESCE(?, usage), activity = ?, "
                "last_tool = COALESCE(?, last_tool), updated_at = ?, lease_until = COALESCE(?, lease_until) "
                "WHERE id = ? AND owner = ? AND status = 'running'",
                (turns, tool_calls, json.dumps(usage) if usage is not None else None, activity, last_tool,
                 now, now + lease_s if lease_s is not None else None, job_id, owner)).rowcount == 1

    def controls(self, job_id: str, owner: str) -> Controls | None:
        """A running job's controls in one read (None: no such job)."""
        with self._reader() as db:
            row = db.execute(
                "SELECT status, owner, cancel_requested, paused, EXISTS(SELECT 1 FROM inbox WHERE inbox.job_id = "
                "jobs.id AND delivered = 0) AS mail FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            return None
        return Controls(row["status"] == "running" and row["owner"] == owner, bool(row["cancel_requested"]),
                        bool(row["paused"]), bool(row["mail"]))

    def finish(self, job_id: str, exit_reason: ExitReason, *, owner: str | None = None, error: str | None = None,
               turns: int | None = None, tool_calls: int | None = None, usage: dict[str, Any] | None = None,
               lapsed_only: bool = False, check: dict[str, Any] | None = None, returning: bool = False) -> bool:
        """Record the ending (its status follows from the reason; `usage`: this attempt's; `check`: result.json's,
        when the job's check ran). With an owner, only the lease holder may finish (a stale worker cannot
        overwrite); `returning` (with its owner): a `pid run` the sweep ended client_lost (its machine away past the
        grace) ends its job truly. With lapsed_only, only while nobody holds a live lease (the sweeper must not end
        a job just re-claimed)."""
        sql = ("UPDATE jobs SET status = ?, exit_reason = ?, error = ?, finished_at = ?, lease_until = NULL, "
               "turns = COALESCE(?, turns), tool_calls = COALESCE(?, tool_calls), usage = COALESCE(?, usage), "
               "check_result = ?, activity = NULL WHERE id = ? AND " +
               ("kind = 'run' AND exit_reason = 'client_lost'" if returning and owner is not None else
                "status IN ('queued', 'running')"))
        args: list[Any] = [status_of(exit_reason), exit_reason, error, time.time(), turns, tool_calls,
                           json.dumps(usage) if usage is not None else None,
                           json.dumps(check) if check is not None else None, job_id]
        if owner is not None:
            sql += " AND owner = ?"
            args.append(owner)
        if lapsed_only:
            sql += " AND (lease_until IS NULL OR lease_until < ?)"
            args.append(time.time())
        with self._db() as db:
            return db.execute(sql, args).rowcount == 1

    def take_messages(self, job_id: str) -> "builtins.list[tuple[str, str]]":
        """Undelivered messages in the order they were posted, marked delivered."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            rows = db.execute("SELECT seq, kind, text FROM inbox WHERE job_id = ? AND delivered = 0 ORDER BY seq",
                              (job_id,)).fetchall()
            if rows:
                db.execute(f"UPDATE inbox SET delivered = 1 WHERE seq IN ({','.join('?' * len(rows))})",
                           [r["seq"] for r in rows])
            db.execute("COMMIT")
        return [(r["kind"], r["text"]) for r in rows]

    def hand_back(self, job_id: str, owner: str, turns: int, tool_calls: int,
                  usage: dict[str, Any] | None) -> str | None:
        """A stopping worker gives its running job back to the queue (to be dispatched again at once), with this
        attempt's counts. Not a loss: it does not count against the job's attempts. A job whose cancel was asked
        ends `cancelled` instead: nothing would ever run it again. Returns the job's status now (None: this owner
        no longer held it)."""
        now = time.time()
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            handed = db.execute(
                "UPDATE jobs SET status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END, "
                "exit_reason = CASE WHEN cancel_requested THEN 'cancelled' END, "
                "finished_at = CASE WHEN cancel_requested THEN ? END, owner = NULL, lease_until = NULL, "
                "activity = NULL, handbacks = handbacks + 1, turns = ?, tool_calls = ?, usage = COALESCE(?, usage), "
                "dispatched_at = NULL, undispatched_since = ? WHERE id = ? AND owner = ? AND status = 'running'",
                (now, turns, tool_calls, json.dumps(usage) if usage is not None else None, now, job_id,
                 owner)).rowcount == 1
            row = db.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
            db.execute("COMMIT")
        return row["status"] if handed and row else None


class SqliteRecovery(SqliteDb):
    """The jobs whose worker is gone, found and put back. (Recovery)"""

    def lapsed(self) -> "builtins.list[JobRecord]":
        """Running jobs whose worker stopped renewing: it died, or its machine did."""
        return self.suspects(host=None)

    def suspects(self, host: str | None) -> "builtins.list[JobRecord]":
        """Running jobs that may have lost their process: lapsed ones, and (with a host) those owned by a process
        on that host, which the caller can check for itself."""
        sql = "SELECT * FROM jobs WHERE status = 'running' AND (lease_until < ?"
        args: list[Any] = [time.time()]
        if host is not None:
            sql += " OR substr(owner, 1, length(?)) = ?"
            args += [host + ":", host + ":"]
        with self._db() as db:
            rows = db.execute(sql + ")", args).fetchall()
        return [_record(r) for r in rows]

    def requeue(self, job_id: str, owner: str | None = None, lapsed_only: bool = True) -> bool:
        """A running job whose process is gone goes back to the queue, to be dispatched again (or, if its cancel was
        asked meanwhile, ends `cancelled`). With an owner, only if that process still holds it; with lapsed_only, only
        while its lease has lapsed."""
        now = time.time()
        sql = ("UPDATE jobs SET status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END, "
               "exit_reason = CASE WHEN cancel_requested THEN 'cancelled' END, "
               "finished_at = CASE WHEN cancel_requested THEN ? END, owner = NULL, lease_until = NULL, "
               "activity = NULL, dispatched_at = NULL, undispatched_since = ? WHERE id = ? AND status = 'running'")
        args: list[Any] = [now, now, job_id]
        if owner is not None:
            sql += " AND owner = ?"
            args.append(owner)
        if lapsed_only:
            sql += " AND lease_until < ?"
            args.append(now)
        with self._db() as db:
            return db.execute(sql, args).rowcount == 1


class SqliteBatches(SqliteDb):
    """A batch's budget and limit on running jobs. (Batches)"""

    def set_batch(self, batch_id: str, max_total_cost: float | None, max_running: int | None) -> BatchInfo:
        """Create the batch, or set its limits anew (a rerun may change them); what it spent is kept."""
        with self._db() as db:
            db.execute("INSERT INTO batches (id, max_total_cost, max_running, created_at) VALUES (?, ?, ?, ?) "
                       "ON CONFLICT(id) DO UPDATE SET max_total_cost = excluded.max_total_cost, "
                       "max_running = excluded.max_running", (batch_id, max_total_cost, max_running, time.time()))
        info = self.batch(batch_id)
        assert info is not None
        return info

    def batch(self, batch_id: str) -> BatchInfo | None:
        with self._reader() as db:
            return _batch_info(db, batch_id)

    def add_batch_spend(self, batch_id: str, amount: float) -> BatchInfo | None:
        """Add a model call's cost to its batch, atomically (one transaction): returns the batch as it is now,
        None for an unknown batch."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("UPDATE batches SET spent = spent + ? WHERE id = ?", (float(amount), batch_id))
                info = _batch_info(db, batch_id)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        return info

    def batch_jobs(self, batch_id: str) -> "builtins.list[JobRecord]":
        """Every job of the batch, oldest first: one query, for clients that follow many jobs."""
        with self._reader() as db:
            rows = db.execute("SELECT * FROM jobs WHERE batch = ? ORDER BY created_at", (batch_id,)).fetchall()
        return [_record(r) for r in rows]


class SqliteDispatch(SqliteDb):
    """When each queued job's message was sent: what the reconciler reads. (DispatchRecords)"""

    def create_many(self, specs: "builtins.list[JobSpec]", dispatched: bool = False) -> None:
        """Queued worker jobs, all in one transaction (`pid batch`: one commit for many). With `dispatched`, each is
        recorded as dispatched now, as dispatch() records it before it publishes: the caller publishes next (and
        marks undispatched one whose publish fails)."""
        now = time.time()
        rows = [(s.id, json.dumps(s.to_dict()), now, None if dispatched else now, now if dispatched else None,
                 s.batch, s.id[::-1]) for s in specs]
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany("INSERT INTO jobs (id, spec, status, created_at, kind, undispatched_since, "
                               "dispatched_at, batch, rid) VALUES (?, ?, 'queued', ?, 'worker', ?, ?, ?, ?)", rows)
            except sqlite3.IntegrityError as exc:
                db.execute("ROLLBACK")
                raise ValueError(f"a job exists already ({exc})") from None
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def mark_dispatched(self, job_id: str, previous: float | None = None, *, only_if: bool = False) -> bool:
        """Record a publish about to happen. With only_if, only if the job is still queued and its last dispatch is
        still `previous`: of several workers re-dispatching one job, one wins."""
        sql = "UPDATE jobs SET dispatched_at = ? WHERE id = ? AND status IN ('queued', 'running')"
        args: list[Any] = [time.time(), job_id]
        if only_if:
            sql += " AND status = 'queued' AND dispatched_at IS ?"
            args.append(previous)
        with self._db() as db:
            return db.execute(sql, args).rowcount == 1

    def mark_published(self, job_id: str) -> None:
        """The publish worked: the job no longer waits for one."""
        with self._db() as db:
            db.execute("UPDATE jobs SET dispatch_error = NULL, undispatched_since = NULL WHERE id = ?", (job_id,))

    def mark_undispatched(self, job_id: str, error: str, parked: bool = False) -> None:
        """The publish failed: the job waits for a worker's reconciler to try again. `undispatched_since` keeps
        when its publishes began to fail; a job its batch holds back (`parked`: --max-running) is not failing, and
        has none."""
        with self._db() as db:
            db.execute("UPDATE jobs SET dispatched_at = NULL, dispatch_error = ?, undispatched_since = CASE WHEN ? "
                       "THEN NULL WHEN dispatch_error IS NULL OR undispatched_since IS NULL THEN ? ELSE "
                       "undispatched_since END WHERE id = ? AND status = 'queued'",
                       (error[:500], parked, time.time(), job_id))

    def to_dispatch(self, stale_before: float | None) -> "builtins.list[JobRecord]":
        """Queued worker jobs that need a message: never dispatched (or the publish failed), or (with
        stale_before) dispatched before then and still not taken, so their message is presumably lost."""
        sql = ("SELECT * FROM jobs WHERE status = 'queued' AND kind = 'worker' AND cancel_requested = 0 "
               "AND (dispatched_at IS NULL")
        args: list[Any] = []
        if stale_before is not None:
            sql += " OR dispatched_at < ?"
            args.append(stale_before)
        with self._db() as db:
            rows = db.execute(sql + ") ORDER BY created_at", args).fetchall()
        return [_record(r) for r in rows]


# a beat that ends a silence of over `?` seconds of the same process (workers.*: the row before this beat)
_SILENCE = ("workers.identity = excluded.identity AND workers.stopped_at IS NULL AND "
            "excluded.beat_at - workers.beat_at > ?")


class SqliteHeartbeats(SqliteDb):
    """The workers' heartbeats. (Heartbeats)"""

    def beat(self, node: str, host: str, pid: int, boot_id: str | None, concurrency: int, running: int,
             taking_jobs: bool, queues: "builtins.list[str] | None" = None,
             policy: dict[str, Any] | None = None, identity: str | None = None,
             alarm: str | None = None, pool: "builtins.list[dict[str, Any]] | None" = None,
             silent_s: float = ALIVE_WITHIN_S) -> None:
        """A worker is alive; `free_since` tracks how long it has had a free slot while taking jobs, `silent_since`
        and `resumed_at` its last silence of over silent_s."""
        now = time.time()
        free = taking_jobs and running < concurrency
        with self._db() as db:
            db.execute(
                "INSERT INTO workers (node, host, pid, boot_id, concurrency, running, free_since, started_at, beat_at, "
                "queues, policy, identity, alarm, pool) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(node) DO "
                "UPDATE SET concurrency = excluded.concurrency, running = excluded.running, "
                "beat_at = excluded.beat_at, boot_id = excluded.boot_id, queues = excluded.queues, "
                "policy = excluded.policy, "
                "identity = excluded.identity, alarm = excluded.alarm, pool = excluded.pool, stopped_at = NULL, "
                "free_since = CASE WHEN ? THEN COALESCE(workers.free_since, excluded.beat_at) ELSE NULL END, "
                f"silent_since = CASE WHEN {_SILENCE} THEN workers.beat_at ELSE workers.silent_since END, "
                f"resumed_at = CASE WHEN {_SILENCE} THEN excluded.beat_at ELSE workers.resumed_at END",
                (node, host, pid, boot_id, concurrency, running, now if free else None, now, now,
                 ",".join(queues or [DEFAULT_QUEUE]), json.dumps(policy) if policy else None, identity, alarm,
                 json.dumps(pool) if pool else None, free, silent_s, silent_s))

    def worker_stopped(self, node: str) -> None:
        """The worker stopped cleanly: its heartbeat stays, marked stopped (`pid workers --all` lists it), until
        forget_silent_workers forgets it with the others not heard from."""
        with self._db() as db:
            db.execute("UPDATE workers SET stopped_at = ?, running = 0, free_since = NULL, pool = NULL WHERE node = ?",
                       (time.time(), node))   # (its warm pool was removed as it stopped)

    def forget_silent_workers(self, silent_s: float = 86400) -> None:
        """Workers not heard from for a day (killed, or stopped) leave the table."""
        with self._db() as db:
            db.execute("DELETE FROM workers WHERE beat_at < ?", (time.time() - silent_s,))

    def workers(self, alive_within_s: float | None = None) -> "builtins.list[WorkerBeat]":
        """Workers by heartbeat; with alive_within_s, only those heard from that recently and not stopped."""
        sql, args = "SELECT * FROM workers", []
        if alive_within_s is not None:
            sql += " WHERE beat_at >= ? AND stopped_at IS NULL"
            args.append(time.time() - alive_within_s)
        with self._db() as db:
            rows = db.execute(sql + " ORDER BY started_at", args).fetchall()
        return [WorkerBeat(**{k: r[k] for k in r.keys() if k not in ("queues", "policy", "pool")},
                           queues=_queues(r["queues"]), policy=_policy(r["policy"]), pool=_pool(r["pool"]))
                for r in rows]


class SqliteBlobs(SqliteDb):
    """Blobs (BlobStore): files under blobs/, named by their SHA-256, written to a temporary file and renamed when
    whole."""

    def _blob_path(self, digest: str) -> str:
        return os.path.join(self.blob_dir, blob_hex(digest))

    def put_blob(self, stream: BinaryIO) -> str:
        """Store what `stream` holds (read in chunks, never whole in memory); returns its "sha256:<hex>". A reader
        never sees part of a blob: it appears under its name only when complete. Storing one that exists again
        only renews its age."""
        os.makedirs(self.blob_dir, exist_ok=True)
        tmp = os.path.join(self.blob_dir, f".tmp-{uuid.uuid4().hex}")
        sha = hashlib.sha256()
        try:
            with open(tmp, "wb") as f:
                while chunk := stream.read(BLOB_CHUNK):
                    sha.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            digest = "sha256:" + sha.hexdigest()
            final = self._blob_path(digest)
            if os.path.exists(final):
                os.unlink(tmp)
                os.utime(final)
            else:
                os.replace(tmp, final)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return digest

    def put_blob_file(self, path: str, digest: str | None = None) -> str:
        """A file as a blob. With its digest known, a blob already stored is not read nor sent again (its age is
        renewed). ValueError if the file's content does not match `digest`."""
        if digest is not None and self.has_blob(digest):
            try:
                os.utime(self._blob_path(digest))
                return digest
            except FileNotFoundError:   # pruned just now
                pass
        return blob_from_file(self, path, digest)

    def has_blob(self, digest: str) -> bool:
        return os.path.exists(self._blob_path(digest))

    def open_blob(self, digest: str) -> Iterator[bytes]:
        """The blob's bytes, in chunks; BlobMissing (now, not on first read) if there is none."""
        try:
            f = open(self._blob_path(digest), "rb")
        except FileNotFoundError:
            raise BlobMissing(digest) from None
        return _file_chunks(f)

    def pin_blob(self, digest: str) -> bool:
        """Keep a blob past the retention period (False: no such blob)."""
        if not self.has_blob(digest):
            return False
        with self._db() as db:
            db.execute("INSERT OR IGNORE INTO blob_pins (digest) VALUES (?)", (digest,))
        return True


class SqliteAttachments(SqliteBlobs):
    """Per job: its events, artifacts and API key. (JobAttachments)"""

    def append_event(self, job_id: str, event: dict[str, Any]) -> int:
        """Add an event to the job's log; returns its number (1, 2, ...). The newest `events_kept` (EVENTS_KEPT)
        are kept, older ones are dropped. KeyError for an unknown job."""
        data = json.dumps(event)
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                if db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
                    raise KeyError(job_id)
                seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job_id = ?",
                                 (job_id,)).fetchone()[0]
                db.execute("INSERT INTO events (job_id, seq, data) VALUES (?, ?, ?)", (job_id, seq, data))
                if seq > self.events_kept:
                    db.execute("DELETE FROM events WHERE job_id = ? AND seq <= ?", (job_id, seq - self.events_kept))
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        return int(seq)

    def events(self, job_id: str, after: int = 0,
               wait_s: float = 0) -> "builtins.list[tuple[int, dict[str, Any]]]":
        """The job's events numbered above `after`, oldest first; with wait_s, waits that long for one when there
        is none yet (SQLite has no notification: it polls every 50 ms)."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._reader() as db:
                rows = db.execute("SELECT seq, data FROM events WHERE job_id = ? AND seq > ? ORDER BY seq",
                                  (job_id, after)).fetchall()
            left = deadline - time.monotonic()
            if rows or left <= 0:
                return [(r["seq"], json.loads(r["data"])) for r in rows]
            time.sleep(min(0.05, left))

    def put_artifact(self, job_id: str, name: str, stream: BinaryIO, limit: int = ARTIFACT_LIMIT) -> str:
        """Store a file the job produced under `name` (replacing one of that name); returns its blob digest.
        TooLarge past `limit` bytes (nothing is recorded then); KeyError for an unknown job."""
        check_artifact_name(name)
        with self._reader() as db:
            if db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
                raise KeyError(job_id)
        capped = Capped(stream, limit, f"artifact {name!r}")
        digest = self.put_blob(capped)   # type: ignore[arg-type]
        with self._db() as db:
            db.execute("INSERT OR REPLACE INTO artifacts (job_id, name, digest, size) VALUES (?, ?, ?, ?)",
                       (job_id, name, digest, capped.read_bytes))
        return digest

    def delete_artifact(self, job_id: str, name: str) -> bool:
        """Forget the job's artifact of that name (its blob ages out like any other); False: there was none."""
        with self._db() as db:
            return db.execute("DELETE FROM artifacts WHERE job_id = ? AND name = ?", (job_id, name)).rowcount > 0

    def drop_own_blob(self, job_id: str, digest: str) -> bool:
        """Remove now a blob only this job could have made (a copy of its running transcript, replaced since),
        unless an artifact or a pin names it; True when removed. (Other blobs nothing names age out: prune.)"""
        path = self._blob_path(digest)
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")   # (no artifact can come to name it meanwhile)
            try:
                named = db.execute("SELECT 1 FROM artifacts WHERE digest = ? UNION ALL "
                                   "SELECT 1 FROM blob_pins WHERE digest = ? LIMIT 1", (digest, digest)).fetchone()
                if named is not None:
                    return False
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    return False
                return True
            finally:
                db.execute("COMMIT")

    def artifact_names(self, job_id: str) -> "builtins.list[str]":
        with self._reader() as db:
            return [r["name"] for r in db.execute("SELECT name FROM artifacts WHERE job_id = ? ORDER BY name",
                                                  (job_id,))]

    def open_artifact(self, job_id: str, name: str) -> Iterator[bytes]:
        """The artifact's bytes in chunks; BlobMissing if the job has none by that name."""
        with self._reader() as db:
            row = db.execute("SELECT digest FROM artifacts WHERE job_id = ? AND name = ?", (job_id, name)).fetchone()
        if row is None:
            raise BlobMissing(f"{job_id}: {name}")
        return self.open_blob(row["digest"])

    def set_secret(self, job_id: str, api_key: str) -> bool:
        """The job's API key, kept only while it is queued or running (its end deletes it: a trigger); never in
        its record. False if the job is unknown or ended."""
        with self._db() as db:
            return db.execute("INSERT OR REPLACE INTO secrets (job_id, api_key) SELECT ?, ? WHERE EXISTS "
                              "(SELECT 1 FROM jobs WHERE id = ? AND status IN ('queued', 'running'))",
                              (job_id, api_key, job_id)).rowcount == 1

    def secret(self, job_id: str) -> str | None:
        with self._db() as db:
            row = db.execute("SELECT api_key FROM secrets WHERE job_id = ?", (job_id,)).fetchone()
        return row["api_key"] if row else None


class SqliteRetention(SqliteDb):
    """Forgetting ended jobs, and blobs nothing keeps, after PID_RETENTION. (Retention)"""

    def prune(self) -> dict[str, int]:
        """Forget what retention lets go: jobs ended longer than PID_RETENTION ago (unless pinned) with their
        messages, events, artifacts and key, and blobs not stored since then that no artifact names nor a pin keeps.
        Housekeeping calls it; returns what was removed."""
        cutoff = time.time() - (self.retention if self.retention is not None else retention_s())
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                jobs = db.execute("DELETE FROM jobs WHERE status NOT IN ('queued', 'running') AND pinned = 0 "
                                  "AND COALESCE(finished_at, created_at) < ?", (cutoff,)).rowcount
                for table in ("inbox", "events", "artifacts", "secrets"):
                    db.execute(f"DELETE FROM {table} WHERE job_id NOT IN (SELECT id FROM jobs)")
                db.execute("DELETE FROM batches WHERE created_at < ? AND id NOT IN "
                           "(SELECT batch FROM jobs WHERE batch IS NOT NULL)", (cutoff,))
                keep = {row[0] for row in db.execute("SELECT digest FROM artifacts UNION SELECT digest FROM blob_pins")}
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        blobs = 0
        try:
            entries = list(os.scandir(self.blob_dir))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            try:
                if entry.name.startswith(".tmp-"):   # an upload that died: no live one takes a day
                    if entry.stat().st_mtime < time.time() - 86400:
                        os.unlink(entry.path)
                elif "sha256:" + entry.name not in keep and entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
                    blobs += 1
            except FileNotFoundError:
                pass
        return {"jobs": jobs, "blobs": blobs}


class JobStore(SqliteRecords, SqliteLeases, SqliteRecovery, SqliteBatches, SqliteDispatch, SqliteHeartbeats,
               SqliteAttachments, SqliteBlobs, SqliteRetention):
    """The SQLite store (see the module's docstring); blobs are files under blobs/ next to the database."""


def _file_chunks(f: BinaryIO) -> Iterator[bytes]:
    with f:
        while chunk := f.read(BLOB_CHUNK):
            yield chunk


def _take(db: sqlite3.Connection, job_id: str, owner: str, now: float, lease_s: float) -> bool:
    """claim's body, inside its transaction."""
    row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None or row["cancel_requested"] or not (
            row["status"] == "queued" or (row["status"] == "running" and (row["lease_until"] or 0) < now)):
        return False
    if row["batch"] is not None:
        batch = _batch_info(db, row["batch"], besides=job_id)
        if batch is not None and (batch.exhausted or (batch.max_running is not None
                                                      and batch.running >= batch.max_running)):
            return False
    earlier = json.loads(row["earlier"] or "[]")
    if row["attempts"] > 0:
        earlier.append({"attempt": row["attempts"], "turns": row["turns"], "tool_calls": row["tool_calls"],
                        "usage": sum_usage(json.loads(row["usage"] or "{}"))})
    db.execute("UPDATE jobs SET status = 'running', owner = ?, lease_until = ?, attempts = attempts + 1, "
               "started_at = COALESCE(started_at, ?), earlier = ?, turns = 0, tool_calls = 0, usage = NULL, "
               "activity = NULL, last_tool = NULL, updated_at = ?, claimed_at = ? WHERE id = ?",
               (owner, now + lease_s, now, json.dumps(earlier), now, now, job_id))
    if row["attempts"] > 0:   # a new attempt starts the conversation again: every message is its to read again
        db.execute("UPDATE inbox SET delivered = 0 WHERE job_id = ?", (job_id,))
    return True


def _batch_info(db: sqlite3.Connection, batch_id: str, besides: str | None = None) -> BatchInfo | None:
    row = db.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
    if row is None:
        return None
    running = db.execute("SELECT COUNT(*) FROM jobs WHERE batch = ? AND status = 'running' AND id IS NOT ?",
                         (batch_id, besides)).fetchone()[0]
    return BatchInfo(batch_id, row["max_total_cost"], row["max_running"], round(row["spent"], 9), running)


def _record(row: sqlite3.Row) -> JobRecord:
    return JobRecord(row["id"], JobSpec.from_dict(json.loads(row["spec"])), row["status"], row["owner"],
                     row["lease_until"], row["attempts"], bool(row["cancel_requested"]), bool(row["paused"]),
                     row["turns"], row["tool_calls"], row["exit_reason"], row["error"], row["created_at"],
                     row["started_at"], row["finished_at"], row["kind"], json.loads(row["usage"] or "{}"),
                     json.loads(row["earlier"] or "[]"), row["activity"], row["last_tool"], row["updated_at"],
                     row["claimed_at"], row["handbacks"], row["dispatched_at"], row["dispatch_error"],
                     row["undispatched_since"], json.loads(row["check_result"]) if row["check_result"] else None)
