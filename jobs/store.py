"""The job store: each job's own record is the source of truth; the broker only dispatches.

A job is claimed by one worker at a time under a lease that the worker renews while it runs. A duplicate message
(a re-dispatch, a redelivery) finds the job claimed and does nothing; a job whose worker died (its lease lapsed, or
its process is gone) is put back in the queue by the sweeper (jobs/sweep.py), and the store records when each
queued job was dispatched so that one whose message was lost is dispatched again (worker/housekeeping.py). Workers
record a heartbeat here too.

This module is the contract (`Store`, its roles, the records they return) and `open_store`, which picks one of its
two implementations from PID_STORE_URL: SQLite under PID_HOME for one machine (jobs/sqlite_store.py), Redis across
machines (jobs/redis_store.py). Besides the jobs, a store keeps content-addressed blobs, each job's events,
artifacts and API key (for the life of the job), and forgets ended jobs after a retention period (PID_RETENTION).
"""
from __future__ import annotations

import builtins
import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterator, Protocol

from pid.endings import TERMINAL_STATUSES, ExitReason, check_passed_of, exit_code_of
from pid.jobs.spec import DEFAULT_QUEUE, JobSpec
from pid import settings
from pid.errors import PidError

USAGE_KEYS = ("input", "output", "cache_read", "cache_write", "reasoning", "total_tokens")

EVENTS_KEPT = 10_000                    # per job: older events are dropped
ARTIFACT_LIMIT = 256 * 1024 * 1024      # bytes per artifact, by default
BLOB_CHUNK = 1024 * 1024                # the unit blobs are streamed (and, in Redis, stored) in
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


def with_dropped(events: builtins.list[tuple[int, dict[str, Any]]],
                 after: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """A job's events as read after number `after`, with a "dropped" record where numbers are missing: a store
    keeps a job's newest EVENTS_KEPT only, so a long job's log would otherwise start (or go on) later without a
    word. The record carries the number before the next event, so that reading on after it loses nothing."""
    for n, record in events:
        if n > after + 1:
            yield n - 1, {"type": "dropped", "count": n - after - 1, "t": record.get("t"),
                          "why": f"a job's log keeps its newest {EVENTS_KEPT:,} records"}
        yield n, record
        after = n


class BlobMissing(KeyError):
    """No blob (or artifact) by that name: never stored, or expired."""


class StoreUnavailable(sqlite3.OperationalError):
    """A SQLite store whose file cannot be made or opened (a path through a file, a read-only place)."""


class TooLarge(ValueError):
    """An artifact over its size limit: nothing was stored."""


def retention_s(value: str | None = None) -> float:
    """PID_RETENTION (or `value`, as it would be written there): how long an ended job (its record, events and
    artifacts) and an unpinned blob are kept; 7 days when unset. A BadSetting (a PidError) for anything else."""
    return settings.RETENTION.get() if value is None else settings.RETENTION.value_of(value)


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


# A job's activity (JobRecord.activity, jobs/progress.py) once its agent has ended: it takes no more messages
COLLECTING, CHECKING = "collecting the artifacts", "running the check"
AGENT_ENDED = (COLLECTING, CHECKING)


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
    def held(self) -> bool:
        """A pause holds it: queued or running, it makes no model call until resumed (an ended job's flag is moot)."""
        return self.paused and not self.terminal

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
    if any(u.get("estimated") for u in usages):   # (pid counted some of the tokens itself)
        total["estimated"] = True
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


BEAT_S = 2.0                          # a worker's heartbeat (worker/housekeeping.py)
ALIVE_WITHIN_S = 3 * BEAT_S + 1      # a worker not heard from for this long (three beats missed) is presumed gone


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
    policy: dict[str, Any] = field(default_factory=dict)   # the rules it admits jobs by (jobs/policy.py)
    identity: str | None = None     # its process's boot, pid namespace and start time (worker/control.py)
    stopped_at: float | None = None   # when it stopped cleanly (None: it has not)
    alarm: str | None = None   # what went badly wrong that its user must know (jobs/store_watch.py)
    pool: list[dict[str, Any]] = field(default_factory=list)   # its warm pool: per image, sandboxes ready, memory
    # its last silence of over ALIVE_WITHIN_S, from the same process (its identity): from its beat before (silent_since)
    # to its first beat after (resumed_at); the store was out of its reach for that long (jobs/sweep.py)
    silent_since: float | None = None
    resumed_at: float | None = None


class StoreBase(Protocol):
    """What every role has: where the store is, and its clock. Times in records come from the store's clock
    (`now()`); compare them with that, not with the caller's."""

    path: str   # where the store is, for messages (a file, or a Redis URL without its password)

    def now(self) -> float: ...


class JobRecords(StoreBase, Protocol):
    """Jobs as the client makes, finds and steers them: create, look up, cancel, pause, message, pin. Used by the
    CLI (cli/main.py, cli/ids.py, cli/view.py, cli/batch*.py), jobs/sweep.py's cancel_job and `pid run`'s
    ForegroundJob (worker/control.py)."""

    def create(self, spec: JobSpec, kind: str = "worker") -> JobRecord: ...
    def get(self, job_id: str) -> JobRecord | None: ...
    def list(self, limit: int = 50, status: str | None = None) -> "builtins.list[JobRecord]": ...
    def ids_ending(self, suffix: str, limit: int = 10) -> "builtins.list[str]": ...
    def request_cancel(self, job_id: str) -> str | None: ...
    def finish_if_queued(self, job_id: str, exit_reason: ExitReason, error: str | None = None) -> bool: ...
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
               lapsed_only: bool = False, check: dict[str, Any] | None = None, returning: bool = False) -> bool: ...
    def hand_back(self, job_id: str, owner: str, turns: int, tool_calls: int,
                  usage: dict[str, Any] | None) -> str | None: ...


class Recovery(StoreBase, Protocol):
    """Finding attempts whose worker was lost (a lapsed lease, a gone process) and putting their jobs back in the
    queue. Used by jobs/sweep.py."""

    def lapsed(self) -> "builtins.list[JobRecord]": ...
    def suspects(self, host: str | None) -> "builtins.list[JobRecord]": ...
    def requeue(self, job_id: str, owner: str | None = None, lapsed_only: bool = True) -> bool: ...


class Batches(StoreBase, Protocol):
    """Limits shared by a batch's jobs (budget, running cap), enforced at claim time and, for the budget, before
    each model call. Used by cli/batch*.py and jobs/batch_budget.py."""

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
    def mark_undispatched(self, job_id: str, error: str, parked: bool = False) -> None: ...
    def to_dispatch(self, stale_before: float | None) -> "builtins.list[JobRecord]": ...


class Heartbeats(StoreBase, Protocol):
    """Workers' heartbeats: who is alive, what it consumes and admits, a kept stop, and a return from silence. Written
    by worker/housekeeping.py, read through jobs/workers.py live_workers by reconcile and the CLI (`pid workers`,
    submit's refusal of a job no worker admits), and by jobs/sweep.py (a lapsed lease on another host)."""

    def beat(self, node: str, host: str, pid: int, boot_id: str | None, concurrency: int, running: int,
             taking_jobs: bool, queues: "builtins.list[str] | None" = None,
             policy: dict[str, Any] | None = None, identity: str | None = None, alarm: str | None = None,
             pool: "builtins.list[dict[str, Any]] | None" = None, silent_s: float = ALIVE_WITHIN_S) -> None: ...
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
    def drop_own_blob(self, job_id: str, digest: str) -> bool: ...
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
    (tests/test_store_contract.py): JobStore (SQLite under PID_HOME, one machine) and pid.jobs.redis_store.RedisStore
    (a cluster). A function that needs one role asks for that role; one that needs several asks for Store."""




def store_url() -> str | None:
    """The store pid uses: PID_STORE_URL; else the broker's Redis when PID_BROKER_URL is one (a cluster needs one
    store, and a Redis broker is one every machine reaches); else None, SQLite under PID_HOME."""
    url = settings.STORE_URL.raw()
    if url:
        return url
    from pid.jobs.brokers import broker_problem, redis_broker
    broker = redis_broker()
    problem = None if broker else broker_problem()
    if problem:   # (a mistyped Redis URL had quietly meant this machine's SQLite store: `pid list` said "no jobs")
        raise PidError(problem)
    return broker


def store_variable() -> str:
    """The variable that names the store in use, for messages: PID_STORE_URL when set, else PID_BROKER_URL."""
    return settings.STORE_URL.name if settings.STORE_URL.raw() else settings.BROKER_URL.name


LIST_LIMIT = 20   # `pid list` and pid.list_jobs() without a limit: the newest jobs (a batch's: all of them)


_redis_stores: dict[tuple[int, str], Store] = {}   # one client (and connection pool) per URL and process
_sqlite_stores: dict[tuple[int, str], Store] = {}   # one per database file and process (_sqlite_store)


def open_store(url: str | None, variable: str = settings.STORE_URL.name) -> Store:
    """The store at `url`: None or "" -> SQLite under PID_HOME; sqlite:///ABS/PATH.db -> SQLite there;
    redis://HOST:PORT/DB (rediss://, unix://) -> RedisStore (one per URL and process: it holds a connection pool).
    PidError (a ValueError: the command's one line), naming `variable`, for any other URL or a bad PID_RETENTION."""
    retention_s()   # (checked now: the SQLite store reads it at its first prune, an hour into a worker's life)
    if not url:
        from pid.config import pid_home
        return _sqlite_store(os.path.join(pid_home(), "jobs.db"))
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        path = url[len("sqlite://"):]
        if not path.startswith("/") or path.endswith("/"):
            raise PidError(f"{variable}={url}: a SQLite store is named by an absolute file path, "
                           "sqlite:///ABS/PATH.db")
        return _sqlite_store(path)
    if scheme in ("redis", "rediss", "unix"):
        key = (os.getpid(), url)
        store = _redis_stores.get(key)
        if store is None:
            from pid.jobs.clients import check_clients
            check_clients({variable: url})
            from pid.jobs.redis_store import RedisStore
            store = _redis_stores[key] = RedisStore(url)
        return store
    shown = url[:200] if "@" not in url else scheme + "://…"   # never a password
    raise PidError(f"{variable}={shown}: not a store pid knows: use sqlite:///ABS/PATH.db or "
                   "redis://HOST:PORT/DB")


def _sqlite_store(path: str) -> Store:
    """One per file and process, as a Redis store is per URL: each keeps a connection per thread for its frequent
    reads, so a store per caller held two descriptors for every pid.Job still referenced (an eval holding its 500
    Jobs ran out of them), and checked the schema again at every open."""
    from pid.jobs.sqlite_store import JobStore   # (it imports this module)
    key = (os.getpid(), os.path.abspath(path))
    store = _sqlite_stores.get(key)
    if store is None or not os.path.exists(path):   # (one removed meanwhile is made again, as before)
        store = _sqlite_stores[key] = JobStore(path)
    return store


def blob_from_file(store: BlobStore, path: str, digest: str | None) -> str:
    """put_blob_file's upload, once the store found no blob of that digest: the file's content, checked against it."""
    with open(path, "rb") as f:
        stored = store.put_blob(f)
    if digest is not None and stored != digest:
        raise ValueError(f"{path}: its content is {stored}, not {digest}")
    return stored


def _queues(text: str | None) -> list[str]:
    return [q for q in (text or "").split(",") if q] or [DEFAULT_QUEUE]


def _pool(text: str | None) -> list[dict[str, Any]]:
    """A heartbeat's warm pool (JSON written by the worker): only well-formed entries (image, ready, memory)."""
    try:
        value = json.loads(text) if text else []
    except ValueError:
        return []
    if not isinstance(value, list):
        return []
    return [{"image": str(e.get("image", "")), "ready": int(e.get("ready") or 0), "memory": int(e.get("memory") or 0)}
            for e in value if isinstance(e, dict) and isinstance(e.get("ready", 0), int)
            and isinstance(e.get("memory", 0), int)]


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
