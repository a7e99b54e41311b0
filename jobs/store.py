"""The job store: each job's own record is the source of truth; the broker only dispatches.

A job is claimed by one worker at a time under a lease that the worker renews while it runs. A duplicate message
(a re-dispatch, a redelivery) finds the job claimed and does nothing; a job whose worker died (its lease lapsed, or
its process is gone) is put back in the queue by the sweeper (worker/sweep.py), and the store records when each
queued job was dispatched so that one whose message was lost is dispatched again (worker/housekeeping.py). Workers
record a heartbeat here too. SQLite (WAL) under PID_HOME: one file, no server, safe across the worker's processes
on one machine, and across fork(): a fork waits until no thread of the process is inside SQLite.

Across machines the same interface (`Store`, below) is served by Redis (jobs/redis_store.py); `open_store` picks
one from PID_STORE_URL. Besides the jobs, a store keeps content-addressed blobs, each job's events, artifacts and
API key (for the life of the job), and forgets ended jobs after a retention period (PID_RETENTION).
"""
from __future__ import annotations

import builtins
import hashlib
import json
import os
import re
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterator, Protocol

from pid.endings import TERMINAL_STATUSES, ExitReason, check_passed_of, exit_code_of, status_of
from jobs.spec import DEFAULT_QUEUE, JobSpec
from pid import settings

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
  policy TEXT,                     -- the rules it admits jobs by, JSON (worker/policy.py); NULL: everything
  identity TEXT,                   -- its process's boot, pid namespace and start time (worker/control.py)
  stopped_at REAL,                 -- when it stopped cleanly; NULL: it has not (alive, or killed: silent)
  alarm TEXT                       -- what went badly wrong that its user must know (jobs/store_watch.py)
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
WORKER_COLUMNS = {"queues": "TEXT", "policy": "TEXT", "identity": "TEXT", "stopped_at": "REAL", "alarm": "TEXT"}
USAGE_KEYS = ("input", "output", "cache_read", "cache_write", "total_tokens")

EVENTS_KEPT = 10_000                    # per job: older events are dropped
ARTIFACT_LIMIT = 256 * 1024 * 1024      # bytes per artifact, by default
BLOB_CHUNK = 1024 * 1024                # the unit blobs are streamed (and, in Redis, stored) in
DEFAULT_RETENTION_S = 7 * 86400
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", re.IGNORECASE)
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class BlobMissing(KeyError):
    """No blob (or artifact) by that name: never stored, or expired."""


class StoreUnavailable(sqlite3.OperationalError):
    """A SQLite store whose file cannot be made or opened (a path through a file, a read-only place)."""


class TooLarge(ValueError):
    """An artifact over its size limit: nothing was stored."""


def retention_s(value: str | None = None) -> float:
    """PID_RETENTION (or `value`): seconds, or a number with a unit s/m/h/d/w ("7d"); 7 days when unset. How long
    an ended job (its record, events and artifacts) and an unpinned blob are kept."""
    raw = settings.RETENTION.raw() if value is None else value
    if not raw:
        return DEFAULT_RETENTION_S
    m = _DURATION.fullmatch(raw)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"PID_RETENTION={raw!r} is not a duration: give seconds or e.g. 12h, 7d, 2w")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def blob_hex(digest: str) -> str:
    """The hex part of "sha256:<64 hex>", or ValueError: digests name files and keys, so they are checked."""
    m = _DIGEST.fullmatch(digest)
    if not m:
        raise ValueError(f"not a blob digest (sha256:<64 lowercase hex>): {digest[:80]!r}")
    return m.group(1)


def check_artifact_name(name: str) -> None:
    """A name is a label (often a relative path), never used as a path by the store itself."""
    if not name or "\0" in name or len(name.encode("utf-8", "surrogateescape")) > 4096:
        raise ValueError(f"bad artifact name: {name[:80]!r}")


class Capped:
    """A stream that raises TooLarge once more than `limit` bytes have been read from it."""

    def __init__(self, stream: BinaryIO, limit: int, what: str) -> None:
        self.stream, self.limit, self.what, self.read_bytes = stream, limit, what, 0

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n if n is not None and n >= 0 else self.limit + 1)
        self.read_bytes += len(data)
        if self.read_bytes > self.limit:
            raise TooLarge(f"{self.what} is larger than its limit of {self.limit} bytes")
        return data


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
    check: dict[str, Any] | None = None   # result.json's `check` (--check), once it ran: its verdict sets the exit code

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
        d["exit_code"] = self.exit_code
        return d

    @property
    def exit_code(self) -> int | None:
        """The ended job's exit code (pid.endings.exit_code_of: the CLI's), None while it runs."""
        if not self.terminal:
            return None
        return exit_code_of(self.exit_reason, check_passed_of({"check": self.check}))


def sum_usage(*usages: dict[str, Any]) -> dict[str, Any]:
    """Usage dicts in result.json's shape, added up."""
    total: dict[str, Any] = {k: sum(int(u.get(k) or 0) for u in usages) for k in USAGE_KEYS}
    total["cost"] = round(sum(float(u.get("cost") or 0.0) for u in usages), 6)
    return total


@dataclass
class BatchInfo:
    """A batch's shared limits and spend, as the store keeps them (see `set_batch`)."""
    id: str
    max_total_cost: float | None
    max_running: int | None
    spent: float
    running: int          # its jobs running now

    @property
    def exhausted(self) -> bool:
        """Its budget is spent: no job of it may start, nor make another model call."""
        return self.max_total_cost is not None and self.spent >= self.max_total_cost


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
    queues: list[str] = field(default_factory=lambda: [DEFAULT_QUEUE])   # the queues it consumes
    policy: dict[str, Any] = field(default_factory=dict)   # the rules it admits jobs by (worker/policy.py)
    identity: str | None = None     # its process's boot, pid namespace and start time (worker/control.py)
    stopped_at: float | None = None   # when it stopped cleanly (None: it has not)
    alarm: str | None = None   # what went badly wrong that its user must know (jobs/store_watch.py)


class StoreBase(Protocol):
    """What every role has: where the store is, and its clock. Times in records come from the store's clock
    (`now()`); compare them with that, not with the caller's."""

    path: str   # where the store is, for messages (a file, or a Redis URL without its password)

    def now(self) -> float: ...


class JobRecords(StoreBase, Protocol):
    """Jobs as the client makes, finds and steers them: create, look up, cancel, pause, message, pin. Used by the
    CLI (cli/main.py, cli/ids.py, cli/view.py, cli/batch*.py), worker/sweep.py's cancel_job and `pid run`'s
    ForegroundJob (worker/control.py)."""

    def create(self, spec: JobSpec, kind: str = "worker") -> JobRecord: ...
    def get(self, job_id: str) -> JobRecord | None: ...
    def list(self, limit: int = 50, status: str | None = None) -> "builtins.list[JobRecord]": ...
    def ids_ending(self, suffix: str, limit: int = 10) -> "builtins.list[str]": ...
    def request_cancel(self, job_id: str) -> str | None: ...
    def finish_if_queued(self, job_id: str, exit_reason: ExitReason) -> bool: ...
    def set_paused(self, job_id: str, paused: bool) -> bool: ...
    def post(self, job_id: str, kind: str, text: str) -> bool: ...
    def pin_job(self, job_id: str) -> bool: ...


class Leases(StoreBase, Protocol):
    """A running attempt's hold on its job: claimed by one owner under a lease it renews, reporting progress,
    polling its controls and mail, and ending (finish) or handing the job back. Used by worker/control.py (the
    relay, record_end) and worker/tasks.py; `finish` also by the sweeper, reconcile and the CLI (a submit that
    could not be dispatched)."""

    def claim(self, job_id: str, owner: str, lease_s: float) -> bool: ...
    def renew(self, job_id: str, owner: str, lease_s: float) -> bool: ...
    def progress(self, job_id: str, owner: str, turns: int, tool_calls: int, usage: dict[str, Any] | None = None,
                 activity: str | None = None, last_tool: str | None = None, lease_s: float | None = None) -> bool: ...
    def controls(self, job_id: str, owner: str) -> Controls | None: ...
    def take_messages(self, job_id: str) -> "builtins.list[tuple[str, str]]": ...
    def finish(self, job_id: str, exit_reason: ExitReason, *, owner: str | None = None, error: str | None = None,
               turns: int | None = None, tool_calls: int | None = None, usage: dict[str, Any] | None = None,
               lapsed_only: bool = False, check: dict[str, Any] | None = None) -> bool: ...
    def hand_back(self, job_id: str, owner: str, turns: int, tool_calls: int,
                  usage: dict[str, Any] | None) -> str | None: ...


class Recovery(StoreBase, Protocol):
    """Finding attempts whose worker was lost (a lapsed lease, a gone process) and putting their jobs back in the
    queue. Used by worker/sweep.py."""

    def lapsed(self) -> "builtins.list[JobRecord]": ...
    def suspects(self, host: str | None) -> "builtins.list[JobRecord]": ...
    def requeue(self, job_id: str, owner: str | None = None, lapsed_only: bool = True) -> bool: ...


class Batches(StoreBase, Protocol):
    """Limits shared by a batch's jobs (budget, running cap), enforced at claim time and, for the budget, before
    each model call. Used by cli/batch*.py and worker/batch_budget.py."""

    def set_batch(self, batch_id: str, max_total_cost: float | None, max_running: int | None) -> BatchInfo: ...
    def batch(self, batch_id: str) -> BatchInfo | None: ...
    def add_batch_spend(self, batch_id: str, amount: float) -> BatchInfo | None: ...
    def batch_jobs(self, batch_id: str) -> "builtins.list[JobRecord]": ...


class DispatchRecords(StoreBase, Protocol):
    """The queue's bookkeeping: when each queued job's message was sent, so one whose message was lost is sent
    again. Used by jobs/dispatch.py, worker/housekeeping.py's reconcile and cli/batch_run.py (create_many)."""

    def create_many(self, specs: "builtins.list[JobSpec]", dispatched: bool = False) -> None: ...
    def mark_dispatched(self, job_id: str, previous: float | None = None, *, only_if: bool = False) -> bool: ...
    def mark_published(self, job_id: str) -> None: ...
    def mark_undispatched(self, job_id: str, error: str) -> None: ...
    def to_dispatch(self, stale_before: float | None) -> "builtins.list[JobRecord]": ...


class Heartbeats(StoreBase, Protocol):
    """Workers' heartbeats: who is alive, what it consumes and admits, and a kept stop. Written by
    worker/housekeeping.py, read through its live_workers by reconcile and the CLI (`pid workers`, submit's
    refusal of a job no worker admits)."""

    def beat(self, node: str, host: str, pid: int, boot_id: str | None, concurrency: int, running: int,
             taking_jobs: bool, queues: "builtins.list[str] | None" = None,
             policy: dict[str, Any] | None = None, identity: str | None = None, alarm: str | None = None) -> None: ...
    def worker_stopped(self, node: str) -> None: ...
    def forget_silent_workers(self, silent_s: float = 86400) -> None: ...
    def workers(self, alive_within_s: float | None = None) -> "builtins.list[WorkerBeat]": ...


class BlobStore(StoreBase, Protocol):
    """Content-addressed blobs ("sha256:<hex>"): uploaded workspaces and snapshots. Used through jobs/blobs.py
    and by jobs/continuation.py."""

    def put_blob(self, stream: BinaryIO) -> str: ...
    def put_blob_file(self, path: str, digest: str | None = None) -> str: ...
    def has_blob(self, digest: str) -> bool: ...
    def open_blob(self, digest: str) -> Iterator[bytes]: ...
    def pin_blob(self, digest: str) -> bool: ...


class JobAttachments(StoreBase, Protocol):
    """What a store keeps beside each job for its life: its events, its artifacts (result.json, transcripts, files)
    and its API key. Written by worker/control.py, jobs/artifact_store.py and the CLI (the key); read by
    cli/output.py, cli/view.py, jobs/continuation.py and worker/tasks.py."""

    def append_event(self, job_id: str, event: dict[str, Any]) -> int: ...
    def events(self, job_id: str, after: int = 0, wait_s: float = 0) -> "builtins.list[tuple[int, dict[str, Any]]]": ...
    def put_artifact(self, job_id: str, name: str, stream: BinaryIO, limit: int = ARTIFACT_LIMIT) -> str: ...
    def artifact_names(self, job_id: str) -> "builtins.list[str]": ...
    def delete_artifact(self, job_id: str, name: str) -> bool: ...
    def open_artifact(self, job_id: str, name: str) -> Iterator[bytes]: ...
    def set_secret(self, job_id: str, api_key: str) -> bool: ...
    def secret(self, job_id: str) -> str | None: ...


class Retention(StoreBase, Protocol):
    """Forgetting ended jobs (record, events, artifacts) and unpinned blobs after PID_RETENTION. Used by the
    worker's housekeeping (worker/housekeeping.py)."""

    def prune(self) -> dict[str, int]: ...


class Store(JobRecords, Leases, Recovery, Batches, DispatchRecords, Heartbeats, BlobStore, JobAttachments,
            Retention, Protocol):
    """What pid asks of its job store: every role above. Two implementations with the same semantics
    (tests/test_store_contract.py): JobStore (SQLite under PID_HOME, one machine) and jobs.redis_store.RedisStore
    (a cluster). A function that needs one role asks for that role; one that needs several asks for Store."""


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
    """The SQLite store (see the module's docstring); blobs are files under blobs/ next to the database."""

    def __init__(self, path: str, retention: float | None = None) -> None:
        self.path = path
        self.blob_dir = os.path.join(os.path.dirname(os.path.abspath(path)), "blobs")
        self.retention = retention          # None: PID_RETENTION, read by prune()
        self.events_kept = EVENTS_KEPT
        self._local = threading.local()
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
            try:
                yield held[1]
            except sqlite3.Error:
                self._local.db = None
                held[1].close()
                raise

    def now(self) -> float:
        """The store's clock: this machine's."""
        return time.time()

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
               lapsed_only: bool = False, check: dict[str, Any] | None = None) -> bool:
        """Record the ending (its status follows from the reason; `usage`: this attempt's; `check`: result.json's,
        when the job's check ran). With an owner, only the lease holder may finish (a stale worker cannot
        overwrite); with lapsed_only, only while nobody holds a live lease (the sweeper must not end a job just
        re-claimed)."""
        sql = ("UPDATE jobs SET status = ?, exit_reason = ?, error = ?, finished_at = ?, lease_until = NULL, "
               "turns = COALESCE(?, turns), tool_calls = COALESCE(?, tool_calls), usage = COALESCE(?, usage), "
               "check_result = ?, activity = NULL WHERE id = ? AND status IN ('queued', 'running')")
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

    # -- batches ----------------------------------------------------------------------------------------------

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
             taking_jobs: bool, queues: "builtins.list[str] | None" = None,
             policy: dict[str, Any] | None = None, identity: str | None = None,
             alarm: str | None = None) -> None:
        """A worker is alive; `free_since` tracks how long it has had a free slot while taking jobs."""
        now = time.time()
        free = taking_jobs and running < concurrency
        with self._db() as db:
            db.execute(
                "INSERT INTO workers (node, host, pid, boot_id, concurrency, running, free_since, started_at, beat_at, "
                "queues, policy, identity, alarm) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(node) DO "
                "UPDATE SET concurrency = excluded.concurrency, running = excluded.running, "
                "beat_at = excluded.beat_at, boot_id = excluded.boot_id, queues = excluded.queues, "
                "policy = excluded.policy, "
                "identity = excluded.identity, alarm = excluded.alarm, stopped_at = NULL, "
                "free_since = CASE WHEN ? THEN COALESCE(workers.free_since, excluded.beat_at) ELSE NULL END",
                (node, host, pid, boot_id, concurrency, running, now if free else None, now, now,
                 ",".join(queues or [DEFAULT_QUEUE]), json.dumps(policy) if policy else None, identity, alarm, free))

    def worker_stopped(self, node: str) -> None:
        """The worker stopped cleanly: its heartbeat stays, marked stopped (`pid workers --all` lists it), until
        forget_silent_workers forgets it with the others not heard from."""
        with self._db() as db:
            db.execute("UPDATE workers SET stopped_at = ?, running = 0, free_since = NULL WHERE node = ?",
                       (time.time(), node))

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
        return [WorkerBeat(**{k: r[k] for k in r.keys() if k not in ("queues", "policy")},
                           queues=_queues(r["queues"]), policy=_policy(r["policy"])) for r in rows]

    # -- retention -------------------------------------------------------------------------------------------------

    def pin_job(self, job_id: str) -> bool:
        """Keep this job (record, events, artifacts and their blobs) past the retention period."""
        with self._db() as db:
            return db.execute("UPDATE jobs SET pinned = 1 WHERE id = ?", (job_id,)).rowcount == 1

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

    # -- blobs: files under blobs/, named by their SHA-256; written to a temporary file and renamed when whole ------

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

    # -- per job: events, artifacts, API key -------------------------------------------------------------------

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
               "activity = NULL, updated_at = ?, claimed_at = ? WHERE id = ?",
               (owner, now + lease_s, now, json.dumps(earlier), now, now, job_id))
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


def store_url() -> str | None:
    """The store pid uses: PID_STORE_URL; else the broker's Redis when PID_BROKER_URL is one (a cluster needs one
    store, and a Redis broker is one every machine reaches); else None, SQLite under PID_HOME."""
    url = settings.STORE_URL.raw()
    if url:
        return url
    from jobs.brokers import redis_broker
    return redis_broker()


def store_variable() -> str:
    """The variable that names the store in use, for messages: PID_STORE_URL when set, else PID_BROKER_URL."""
    return settings.STORE_URL.name if settings.STORE_URL.raw() else settings.BROKER_URL.name


_redis_stores: dict[tuple[int, str], Store] = {}   # one client (and connection pool) per URL and process


def open_store(url: str | None, variable: str = settings.STORE_URL.name) -> Store:
    """The store at `url`: None or "" -> SQLite under PID_HOME; sqlite:///ABS/PATH.db -> SQLite there;
    redis://HOST:PORT/DB (rediss://, unix://) -> RedisStore (one per URL and process: it holds a connection pool).
    ValueError, with a one-line message naming `variable`, for any other URL or a bad PID_RETENTION."""
    if not url:
        from pid.config import pid_home
        return JobStore(os.path.join(pid_home(), "jobs.db"))
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        path = url[len("sqlite://"):]
        if not path.startswith("/") or path.endswith("/"):
            raise ValueError(f"{variable}={url}: a SQLite store is named by an absolute file path, "
                             "sqlite:///ABS/PATH.db")
        return JobStore(path)
    if scheme in ("redis", "rediss", "unix"):
        key = (os.getpid(), url)
        store = _redis_stores.get(key)
        if store is None:
            from jobs.clients import check_clients
            check_clients({variable: url})
            from jobs.redis_store import RedisStore
            store = _redis_stores[key] = RedisStore(url)
        return store
    shown = url[:200] if "@" not in url else scheme + "://…"   # never a password
    raise ValueError(f"{variable}={shown}: not a store pid knows: use sqlite:///ABS/PATH.db or "
                     "redis://HOST:PORT/DB")


def blob_from_file(store: BlobStore, path: str, digest: str | None) -> str:
    """put_blob_file's upload, once the store found no blob of that digest: the file's content, checked against it."""
    with open(path, "rb") as f:
        stored = store.put_blob(f)
    if digest is not None and stored != digest:
        raise ValueError(f"{path}: its content is {stored}, not {digest}")
    return stored


def _queues(text: str | None) -> list[str]:
    return [q for q in (text or "").split(",") if q] or [DEFAULT_QUEUE]


def _policy(text: str | None) -> dict[str, Any]:
    """A heartbeat's policy (JSON written by the worker); anything unreadable is none."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def default_store() -> Store:
    """The store named by the environment (store_url())."""
    return open_store(store_url(), store_variable())
