"""The job store: each job's own record is the source of truth; the broker only dispatches.

A job is claimed by one worker at a time under a lease that the worker renews while it runs. A duplicate message
(a re-dispatch, a redelivery) finds the job claimed and does nothing; a job whose worker died (its lease lapsed, or
its process is gone) is put back in the queue by the sweeper (worker/sweep.py), and the store records when each
queued job was dispatched so that one whose message was lost is dispatched again (worker/housekeeping.py). Workers
record a heartbeat here too. SQLite (WAL) under PID_HOME: one file, no server, safe across the worker's processes
on one machine, and across fork(): a fork waits until no thread of the process is inside SQLite.
"""
from __future__ import annotations

import builtins
import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from pid.endings import TERMINAL_STATUSES, ExitReason, status_of
from worker.jobs import JobSpec

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
  free_since REAL,                 -- since when it has had a free process and taken jobs; NULL: busy or stopping
  started_at REAL NOT NULL,
  beat_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS inbox (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  kind TEXT NOT NULL,              -- steer | follow_up
  text TEXT NOT NULL,
  delivered INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS inbox_job ON inbox(job_id, delivered);
"""

# Columns added after the first release: a store made by an older pid gets them on open.
ADDED_COLUMNS = {"kind": "TEXT NOT NULL DEFAULT 'worker'", "usage": "TEXT", "earlier": "TEXT", "activity": "TEXT",
                 "last_tool": "TEXT", "updated_at": "REAL", "claimed_at": "REAL",
                 "handbacks": "INTEGER NOT NULL DEFAULT 0", "dispatched_at": "REAL", "dispatch_error": "TEXT",
                 "undispatched_since": "REAL"}
USAGE_KEYS = ("input", "output", "cache_read", "cache_write", "total_tokens")


@dataclass
class JobRecord:
    id: str
    spec: JobSpec
    status: str
    owner: str | None
    lease_until: float | None
    attempts: int
    cancel_requested: bool
    paused: bool
    turns: int
    tool_calls: int
    exit_reason: str | None
    error: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    kind: str = "worker"
    usage: dict[str, Any] = field(default_factory=dict)        # this attempt's
    earlier: list[dict[str, Any]] = field(default_factory=list)  # earlier attempts' counts
    activity: str | None = None
    last_tool: str | None = None
    updated_at: float | None = None
    claimed_at: float | None = None
    handbacks: int = 0
    dispatched_at: float | None = None
    dispatch_error: str | None = None
    undispatched_since: float | None = None

    @property
    def losses(self) -> int:
        """Attempts whose worker was lost (a handed-back attempt was not)."""
        return self.attempts - self.handbacks

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def total_usage(self) -> dict[str, Any]:
        """Every attempt's tokens and cost: what the job has spent."""
        return sum_usage(*(a.get("usage") or {} for a in self.earlier), self.usage)

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None:
            return None
        return round((self.finished_at or time.time()) - self.started_at, 3)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "spec"}
        d["task"] = self.spec.task
        d["job_dir"] = self.spec.job_dir
        d["duration_s"] = self.duration_s
        d["total_usage"] = self.total_usage
        d["cost"] = d["total_usage"]["cost"]
        return d


def sum_usage(*usages: dict[str, Any]) -> dict[str, Any]:
    """Usage dicts in result.json's shape, added up."""
    total: dict[str, Any] = {k: sum(int(u.get(k) or 0) for u in usages) for k in USAGE_KEYS}
    total["cost"] = round(sum(float(u.get("cost") or 0.0) for u in usages), 6)
    return total


@dataclass
class Controls:
    """What a running job's relay polls for: one read, no write."""
    owned: bool          # still running under this owner
    cancel_requested: bool
    paused: bool
    mail: bool           # undelivered steer / follow-up messages wait


@dataclass
class WorkerBeat:
    node: str
    host: str
    pid: int
    boot_id: str | None
    concurrency: int
    running: int
    free_since: float | None
    started_at: float
    beat_at: float


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


class JobStore:
    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with self._db() as db:
            db.executescript(SCHEMA)
            have = {row["name"] for row in db.execute("PRAGMA table_info(jobs)")}
            for name, decl in ADDED_COLUMNS.items():
                if name not in have:
                    try:
                        db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {decl}")
                    except sqlite3.OperationalError as exc:  # another process added it first
                        if "duplicate column" not in str(exc):
                            raise

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
            try:
                yield held[1]
            except sqlite3.Error:
                self._local.db = None
                held[1].close()
                raise

    def create(self, spec: JobSpec, kind: str = "worker") -> JobRecord:
        """A queued job, not yet dispatched. kind "run" is a foreground `pid run`: its process is its only worker."""
        assert kind in ("worker", "run")
        now = time.time()
        with self._db() as db:
            db.execute("INSERT INTO jobs (id, spec, status, created_at, kind, undispatched_since) "
                       "VALUES (?, ?, 'queued', ?, ?, ?)", (spec.id, json.dumps(spec.to_dict()), now, kind, now))
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

    def claim(self, job_id: str, owner: str, lease_s: float) -> bool:
        """Take the job if it is queued, or running under a lapsed lease. Exactly one claimer wins.

        Taking up a job that ran before keeps that attempt's counts (turns, tool calls, usage) in `earlier`."""
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
               lapsed_only: bool = False) -> bool:
        """Record the ending (its status follows from the reason; `usage`: this attempt's). With an owner, only the
        lease holder may finish (a stale worker cannot overwrite); with lapsed_only, only while nobody holds a live
        lease (the sweeper must not end a job just re-claimed)."""
        sql = ("UPDATE jobs SET status = ?, exit_reason = ?, error = ?, finished_at = ?, lease_until = NULL, "
               "turns = COALESCE(?, turns), tool_calls = COALESCE(?, tool_calls), usage = COALESCE(?, usage), "
               "activity = NULL WHERE id = ? AND status IN ('queued', 'running')")
        args: list[Any] = [status_of(exit_reason), exit_reason, error, time.time(), turns, tool_calls,
                           json.dumps(usage) if usage is not None else None, job_id]
        if owner is not None:
            sql += " AND owner = ?"
            args.append(owner)
        if lapsed_only:
            sql += " AND (lease_until IS NULL OR lease_until < ?)"
            args.append(time.time())
        with self._db() as db:
            return db.execute(sql, args).rowcount == 1

    def request_cancel(self, job_id: str) -> str | None:
        """Ask for a cancel. A queued job is cancelled on the spot; a running one by its worker. Returns the status."""
        with self._db() as db:
            db.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND status IN ('queued', 'running')",
                       (job_id,))
        self.finish_if_queued(job_id, "cancelled")
        record = self.get(job_id)
        return record.status if record else None

    def finish_if_queued(self, job_id: str, exit_reason: ExitReason) -> bool:
        with self._db() as db:
            return db.execute("UPDATE jobs SET status = ?, exit_reason = ?, finished_at = ? "
                              "WHERE id = ? AND status = 'queued'",
                              (status_of(exit_reason), exit_reason, time.time(), job_id)).rowcount == 1

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

    # -- dispatch records: what the reconciler reads ----------------------------------------------------------

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

    def mark_undispatched(self, job_id: str, error: str) -> None:
        """The publish failed: the job waits for a worker's reconciler to try again (`undispatched_since` keeps
        when the waiting began)."""
        with self._db() as db:
            db.execute("UPDATE jobs SET dispatched_at = NULL, dispatch_error = ?, "
                       "undispatched_since = COALESCE(undispatched_since, ?) WHERE id = ? AND status = 'queued'",
                       (error[:500], time.time(), job_id))

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

    # -- worker heartbeats ---------------------------------------------------------------------------------------

    def beat(self, node: str, host: str, pid: int, boot_id: str | None, concurrency: int, running: int,
             taking_jobs: bool) -> None:
        """A worker is alive; `free_since` tracks how long it has had a free process while taking jobs."""
        now = time.time()
        free = taking_jobs and running < concurrency
        with self._db() as db:
            db.execute(
                "INSERT INTO workers (node, host, pid, boot_id, concurrency, running, free_since, started_at, beat_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(node) DO UPDATE SET "
                "concurrency = excluded.concurrency, running = excluded.running, beat_at = excluded.beat_at, "
                "boot_id = excluded.boot_id, "
                "free_since = CASE WHEN ? THEN COALESCE(workers.free_since, excluded.beat_at) ELSE NULL END",
                (node, host, pid, boot_id, concurrency, running, now if free else None, now, now, free))

    def forget_worker(self, node: str) -> None:
        with self._db() as db:
            db.execute("DELETE FROM workers WHERE node = ?", (node,))

    def forget_silent_workers(self, silent_s: float = 86400) -> None:
        """Workers not heard from for a day (killed, not stopped) leave the table."""
        with self._db() as db:
            db.execute("DELETE FROM workers WHERE beat_at < ?", (time.time() - silent_s,))

    def workers(self, alive_within_s: float | None = None) -> "builtins.list[WorkerBeat]":
        """Workers by heartbeat; with alive_within_s, only those heard from that recently."""
        sql, args = "SELECT * FROM workers", []
        if alive_within_s is not None:
            sql += " WHERE beat_at >= ?"
            args.append(time.time() - alive_within_s)
        with self._db() as db:
            rows = db.execute(sql + " ORDER BY started_at", args).fetchall()
        return [WorkerBeat(**{k: r[k] for k in r.keys()}) for r in rows]


def _take(db: sqlite3.Connection, job_id: str, owner: str, now: float, lease_s: float) -> bool:
    """claim's body, inside its transaction."""
    row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None or row["cancel_requested"] or not (
            row["status"] == "queued" or (row["status"] == "running" and (row["lease_until"] or 0) < now)):
        return False
    earlier = json.loads(row["earlier"] or "[]")
    if row["attempts"] > 0:
        earlier.append({"attempt": row["attempts"], "turns": row["turns"], "tool_calls": row["tool_calls"],
                        "usage": sum_usage(json.loads(row["usage"] or "{}"))})
    db.execute("UPDATE jobs SET status = 'running', owner = ?, lease_until = ?, attempts = attempts + 1, "
               "started_at = COALESCE(started_at, ?), earlier = ?, turns = 0, tool_calls = 0, usage = NULL, "
               "activity = NULL, updated_at = ?, claimed_at = ? WHERE id = ?",
               (owner, now + lease_s, now, json.dumps(earlier), now, now, job_id))
    return True


def _record(row: sqlite3.Row) -> JobRecord:
    return JobRecord(row["id"], JobSpec.from_dict(json.loads(row["spec"])), row["status"], row["owner"],
                     row["lease_until"], row["attempts"], bool(row["cancel_requested"]), bool(row["paused"]),
                     row["turns"], row["tool_calls"], row["exit_reason"], row["error"], row["created_at"],
                     row["started_at"], row["finished_at"], row["kind"], json.loads(row["usage"] or "{}"),
                     json.loads(row["earlier"] or "[]"), row["activity"], row["last_tool"], row["updated_at"],
                     row["claimed_at"], row["handbacks"], row["dispatched_at"], row["dispatch_error"],
                     row["undispatched_since"])


def default_store() -> JobStore:
    from pid.config import pid_home
    return JobStore(os.path.join(pid_home(), "jobs.db"))
