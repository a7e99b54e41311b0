"""The job store in Redis: the same semantics as the SQLite JobStore (jobs/sqlite_store.py), for workers and clients on
several machines that share nothing but a Redis.

Atomicity: every operation that reads a job's state and changes it is one Lua script (redis-py `register_script`),
which Redis runs alone: a claim, a renewal, a finish, a requeue can never interleave with another; a script sent
again by redis-py after a lost reply does not run twice (redis_lua/once.lua). Reads that only read (get, list, lapsed,
to_dispatch, workers) are plain commands or pipelines; whoever acts on what they return does so through a script
that checks again. A blob appears by one RENAME of its finished upload.

Time: the Redis server's clock (TIME, called inside the scripts), never the client's. A lease is granted, renewed
and found lapsed by one clock whatever the workers' clocks say, so a machine whose clock runs ahead cannot take a
live job nor keep a lapsed one. Every time in a record (created_at, lease_until, finished_at ...) is on that clock;
`now()` reads it for callers that compare (the sweeper, the reconciler). Needs Redis >= 7 (scripts that write after
TIME; EXPIRE ... GT).

Keys (all under PREFIX "pid:"): job:{id} (a hash: the record's fields, as strings; an absent field is None),
inbox:{id} (a list of [kind, text]), events:{id} (a stream, ids "<n>-0"), evseq:{id}, artifacts:{id} (a hash name ->
digest), secret:{id}; indexes jobs (a sorted set by created_at), st:{status} (per status, by created_at), ended
(by finished_at) and rids (the ids reversed, all at score 0: a suffix of ids is a lexical range of these);
worker:{node} (a hash) and workers (by started_at); blob:{hex} (a list of chunks, each at most BLOB_CHUNK),
upload:{uuid} (one being written) and pins (a set of pinned blobs' hex).

Retention: when a job ends its keys get a TTL of PID_RETENTION (unless it is pinned), its artifacts' blobs at least
that; a blob lives at least PID_RETENTION after its last put; pinned ones have no TTL. Index entries of expired jobs
are dropped by list() as it meets them and by prune().

One Redis, not Redis Cluster: the scripts touch keys they derive from the job id.

Fork: redis-py's connection pool notices a fork by its pid and starts afresh in the child, but it does so under the
pool's own locks, which a fork may copy held (another thread inside the pool at that moment): the child would hang
on them. So a child never touches the parent's client: `_connection()` makes a new one in a new process.
"""
from __future__ import annotations

import builtins
import functools
import hashlib
import json
import os
import time
import uuid
from importlib import resources
from typing import Any, BinaryIO, Iterator

import redis

from pid.endings import ExitReason, status_of
from pid.jobs.brokers import shown_url
from pid.jobs.outage import call_token
from pid.jobs.spec import DEFAULT_QUEUE, JobSpec
from pid.jobs.store import (ALIVE_WITHIN_S, ARTIFACT_LIMIT, BLOB_CHUNK, EVENTS_KEPT, BatchInfo, BlobMissing,
                            Capped, Controls, JobRecord, WorkerBeat, _policy, _pool, _queues, blob_from_file, blob_hex,
                            check_artifact_name,
                            retention_s, sum_usage)

PREFIX = "pid:"
SOCKET_TIMEOUT_S = 60  # a Redis that stopped answering is an error, not a hang (a blocking read waits less)
UPLOAD_TTL_S = 3600    # an upload's temporary key vanishes an hour after its writer stopped sending

# The scripts, one file each in redis_lua/ (each says what it does and why it is atomic). Every script is sent as
# prelude.lua (the arguments and shared helpers) + its body; a script that writes is wrapped in once.lua, so a call
# sent again after a lost reply (RedisDb._run, a job's Patience) does not run twice.
_SCRIPT_NAMES = (
    "create", "claim", "controls", "renew", "progress", "finish", "finish_if_queued", "request_cancel", "set_paused",
    "post", "take_messages", "requeue", "mark_dispatched", "mark_published", "mark_undispatched", "set_batch",
    "add_batch_spend", "batch", "pin_job", "append_event", "put_artifact", "set_secret", "beat", "worker_stopped",
    "forget_silent_workers", "finish_blob", "touch_blob", "pin_blob")
_READ_ONLY = {"controls"}
_ONCE_BODY = "-- {script}\n"


def _lua(name: str) -> str:
    return resources.files("pid.jobs").joinpath("redis_lua", f"{name}.lua").read_text(encoding="utf-8")


def _sources() -> dict[str, str]:
    """Each script's whole source as registered, by name: read once, at import."""
    prelude, once = _lua("prelude"), _lua("once")
    if once.count(_ONCE_BODY) != 1:
        raise RuntimeError(f"redis_lua/once.lua must hold the line {_ONCE_BODY!r} once")
    sources = {}
    for name in _SCRIPT_NAMES:
        body = _lua(name)
        sources[name] = prelude + (body if name in _READ_ONLY else once.replace(_ONCE_BODY, body))
    return sources


_SCRIPTS = _sources()

# Fields of a record that are numbers; the others are strings (absent: None).
_FLOATS = ("lease_until", "created_at", "started_at", "finished_at", "updated_at", "claimed_at", "dispatched_at",
           "undispatched_since")
_INTS = ("attempts", "turns", "tool_calls", "handbacks")


class RedisDb:
    """The connection: this process's client and its scripts, the server's clock, and reading job hashes."""

    def __init__(self, url: str, retention: float | None = None) -> None:
        self.url = url
        self.path = shown_url(url)
        self.retention = retention if retention is not None else retention_s()
        self.events_kept = EVENTS_KEPT
        self._state: tuple[int, redis.Redis, dict[str, Any]] | None = None   # (pid, client, scripts)

    def _connection(self) -> tuple[redis.Redis, dict[str, Any]]:
        """This process's client and scripts. A forked child makes its own, without taking any lock the fork may
        have copied held (two threads of a child racing here make two clients: harmless, one is kept)."""
        state = self._state
        if state is None or state[0] != os.getpid():
            client = redis.Redis.from_url(self.url, socket_connect_timeout=10, socket_timeout=SOCKET_TIMEOUT_S,
                                          socket_keepalive=True, health_check_interval=30)
            scripts = {name: client.register_script(source) for name, source in _SCRIPTS.items()}
            state = self._state = (os.getpid(), client, scripts)
        return state[1], state[2]

    def client(self) -> Any:
        """This process's redis-py client (the broker's too when it is the same Redis: jobs/dispatch.py)."""
        return self._connection()[0]

    @property
    def _r(self) -> Any:
        """The client (Any: redis-py's stubs type replies as bytes | str; with decode_responses off they are
        bytes)."""
        return self.client()

    def _run(self, script: str, job_id: str = "", /, **args: Any) -> Any:
        client, scripts = self._connection()
        argv = [PREFIX, str(self.retention), job_id, json.dumps(args)]
        token, keep_s = call_token(script, *argv)
        argv += [token, str(keep_s)]
        try:
            return scripts[script](args=argv, client=client)
        except redis.ConnectionError:
            # The connection broke, before the script ran or after, its reply lost: sent again with its token, it
            # runs once (once.lua; redis-py, as pid makes its client, sends nothing again itself). Not after a
            # TimeoutError: a server that does not answer is not asked twice.
            return scripts[script](args=argv, client=client)

    def close(self) -> None:
        if self._state is not None and self._state[0] == os.getpid():
            self._state[1].close()

    def persistence(self) -> str | None:
        """How this Redis keeps its data across a restart ("appendonly", "snapshots <save>"), "" when it keeps none,
        None when it will not say (CONFIG refused, as managed services do, and no AOF in INFO)."""
        try:
            found = {**self._r.config_get("appendonly"), **self._r.config_get("save")}
        except redis.ResponseError:
            return "appendonly" if self._r.info("persistence").get("aof_enabled") else None
        config = {_decoded(k): _decoded(v) for k, v in found.items()}
        if config.get("appendonly") == "yes":
            return "appendonly"
        save = config.get("save", "").strip()
        return f"snapshots {save}" if save else ""

    def incarnation(self) -> tuple[str, str]:
        """(the server's run id, pid's mark on this data): a restart changes the first; data lost (a restart without
        persistence, a flush) changes the second, which the first caller after it sets anew."""
        pipe = self._r.pipeline(transaction=False)
        pipe.info("server")
        pipe.set(PREFIX + "store", uuid.uuid4().hex, nx=True)
        pipe.get(PREFIX + "store")
        info, _, mark = pipe.execute()
        return str(info.get("run_id", "")), mark.decode()

    def now(self) -> float:
        """The Redis server's clock, which every lease is on."""
        seconds, micros = self._r.time()
        return seconds + micros / 1_000_000

    def _records(self, ids: "builtins.list[bytes]") -> "builtins.list[JobRecord | None]":
        pipe = self._r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(PREFIX + "job:" + job_id.decode())
        return [_record(f) if f else None for f in pipe.execute()]

    def _drop_from_indexes(self, ids: "builtins.list[bytes]") -> None:
        """Index entries of jobs whose keys expired."""
        if not ids:
            return
        pipe = self._r.pipeline(transaction=False)
        for index in self._r.scan_iter(match=PREFIX + "st:*", count=100):
            pipe.zrem(index, *ids)
        pipe.zrem(PREFIX + "jobs", *ids)
        pipe.zrem(PREFIX + "ended", *ids)
        pipe.zrem(PREFIX + "rids", *[i[::-1] for i in ids])
        pipe.execute()


class RedisRecords(RedisDb):
    """A job's hash: made, read, listed, and what a client asks of it (cancel, pause, a message)
    (JobRecords)."""

    def create(self, spec: JobSpec, kind: str = "worker") -> JobRecord:
        """A queued job, not yet dispatched. kind "run" is a foreground `pid run`: its process is its only worker."""
        assert kind in ("worker", "run")
        try:
            self._run("create", spec.id, spec=json.dumps(spec.to_dict()), kind=kind, batch=spec.batch,
                      dispatched=False)
        except redis.ResponseError as exc:
            raise ValueError(str(exc)) from None
        record = self.get(spec.id)
        assert record is not None
        return record

    def get(self, job_id: str) -> JobRecord | None:
        fields = self._r.hgetall(PREFIX + "job:" + job_id)
        return _record(fields) if fields else None

    def ids_ending(self, suffix: str, limit: int = 10) -> "builtins.list[str]":
        """The ids of jobs that end with `suffix`, at most `limit` of them: one lexical range read of the reversed
        ids (index rids); entries of expired jobs met on the way are dropped."""
        if not suffix:
            return []
        found: builtins.list[str] = []
        start = 0
        while len(found) < limit:
            rids = self._r.zrangebylex(PREFIX + "rids", b"[" + suffix[::-1].encode(),
                                       b"[" + suffix[::-1].encode() + b"\xff", start, limit - len(found))
            if not rids:
                break
            ids = [r[::-1] for r in rids]
            pipe = self._r.pipeline(transaction=False)
            for job_id in ids:
                pipe.exists(PREFIX + "job:" + job_id.decode())
            alive = pipe.execute()
            found += [i.decode() for i, ok in zip(ids, alive) if ok]
            gone = [i for i, ok in zip(ids, alive) if not ok]
            self._drop_from_indexes(gone)
            start += len(rids) - len(gone)
        return found

    def list(self, limit: int = 50, status: str | None = None) -> "builtins.list[JobRecord]":
        """Newest first; only jobs in `status` when given."""
        index = PREFIX + ("st:" + status if status else "jobs")
        found: builtins.list[JobRecord] = []
        start = 0
        while len(found) < limit:
            ids = self._r.zrevrange(index, start, start + limit - len(found) - 1)
            if not ids:
                break
            start += len(ids)
            records = self._records(ids)
            gone = [i for i, r in zip(ids, records) if r is None]
            found += [r for r in records if r is not None]
            if gone:
                self._drop_from_indexes(gone)
                start -= len(gone)
        return found

    def request_cancel(self, job_id: str) -> str | None:
        """Ask for a cancel. A queued job is cancelled on the spot; a running one by its worker. Returns the status."""
        status = self._run("request_cancel", job_id, status=status_of("cancelled"))
        return status.decode() if status else None

    def finish_if_queued(self, job_id: str, exit_reason: ExitReason, error: str | None = None) -> bool:
        return self._run("finish_if_queued", job_id, exit_reason=exit_reason, status=status_of(exit_reason),
                         error=error) == 1

    def set_paused(self, job_id: str, paused: bool) -> bool:
        return self._run("set_paused", job_id, paused=int(paused)) == 1

    def post(self, job_id: str, kind: str, text: str) -> bool:
        """Queue a steering or follow-up message for a queued or running job."""
        assert kind in ("steer", "follow_up")
        return self._run("post", job_id, kind=kind, text=text) == 1

    def pin_job(self, job_id: str) -> bool:
        """Keep this job (its keys, its artifacts' blobs) past the retention period."""
        return self._run("pin_job", job_id) == 1


class RedisLeases(RedisDb):
    """A worker's hold on a job it runs: the claim, its renewal and progress, the end, a hand-back
    (Leases)."""

    def claim(self, job_id: str, owner: str, lease_s: float) -> bool:
        """Take the job if it is queued, or running under a lapsed lease. Exactly one claimer wins.

        Taking up a job that ran before keeps that attempt's counts (turns, tool calls, usage) in `earlier`."""
        return self._run("claim", job_id, owner=owner, lease_s=lease_s) == 1

    def renew(self, job_id: str, owner: str, lease_s: float) -> bool:
        return self._run("renew", job_id, owner=owner, lease_s=lease_s) == 1

    def progress(self, job_id: str, owner: str, turns: int, tool_calls: int, usage: dict[str, Any] | None = None,
                 activity: str | None = None, last_tool: str | None = None, lease_s: float | None = None) -> bool:
        """The running attempt's counts so far; with lease_s, the lease renewed in the same write. Holder only."""
        return self._run("progress", job_id, owner=owner, turns=turns, tool_calls=tool_calls,
                         usage=json.dumps(usage) if usage is not None else None, activity=activity,
                         last_tool=last_tool, lease_s=lease_s) == 1

    def controls(self, job_id: str, owner: str) -> Controls | None:
        """A running job's controls in one read (None: no such job)."""
        found = self._run("controls", job_id, owner=owner)
        return Controls(*(bool(v) for v in found)) if found else None

    def finish(self, job_id: str, exit_reason: ExitReason, *, owner: str | None = None, error: str | None = None,
               turns: int | None = None, tool_calls: int | None = None, usage: dict[str, Any] | None = None,
               lapsed_only: bool = False, check: dict[str, Any] | None = None, returning: bool = False) -> bool:
        """Record the ending, once (`check`: result.json's, when the job's check ran). With an owner, only the lease
        holder may; `returning`: a `pid run` ended client_lost meanwhile, by its owner (SQLite's finish); with
        lapsed_only, only while nobody holds a live lease. The job's API key is deleted; its keys expire after the
        retention period."""
        return self._run("finish", job_id, exit_reason=exit_reason, status=status_of(exit_reason), owner=owner,
                         error=error, turns=turns, tool_calls=tool_calls,
                         usage=json.dumps(usage) if usage is not None else None, lapsed_only=lapsed_only,
                         check=json.dumps(check) if check is not None else None, returning=returning) == 1

    def take_messages(self, job_id: str) -> "builtins.list[tuple[str, str]]":
        """Undelivered messages in the order they were posted, taken (delivered) at once."""
        return [(kind, text) for kind, text in map(json.loads, self._run("take_messages", job_id))]

    def hand_back(self, job_id: str, owner: str, turns: int, tool_calls: int,
                  usage: dict[str, Any] | None) -> str | None:
        """A stopping worker gives its running job back to the queue with this attempt's counts; not a loss.
        Returns the job's status now (None: this owner no longer held it)."""
        status = self._run("requeue", job_id, owner=owner, lapsed_only=False, handback=True, turns=turns,
                           tool_calls=tool_calls, usage=json.dumps(usage) if usage is not None else None,
                           cancelled_status=status_of("cancelled"))
        return status.decode() if status else None


class RedisRecovery(RedisDb):
    """The jobs whose worker is gone, found and put back (Recovery)."""

    def _running(self) -> "builtins.list[JobRecord]":
        ids = self._r.zrange(PREFIX + "st:running", 0, -1)
        return [r for r in self._records(ids) if r is not None and r.status == "running"]

    def lapsed(self) -> "builtins.list[JobRecord]":
        """Running jobs whose worker stopped renewing: it died, or its machine did."""
        return self.suspects(host=None)

    def suspects(self, host: str | None) -> "builtins.list[JobRecord]":
        """Running jobs that may have lost their process: lapsed ones (by the server's clock), and (with a host)
        those owned by a process on that host."""
        now = self.now()
        return [r for r in self._running() if (r.lease_until is not None and r.lease_until < now)
                or (host is not None and (r.owner or "").startswith(host + ":"))]

    def requeue(self, job_id: str, owner: str | None = None, lapsed_only: bool = True) -> bool:
        """A running job whose process is gone goes back to the queue (or ends `cancelled` if that was asked).
        With an owner, only if that process still holds it; with lapsed_only, only while its lease has lapsed."""
        return self._run("requeue", job_id, owner=owner, lapsed_only=lapsed_only, handback=False,
                         cancelled_status=status_of("cancelled")) is not None


class RedisBatches(RedisDb):
    """A batch's budget and limit on running jobs (Batches)."""

    def set_batch(self, batch_id: str, max_total_cost: float | None, max_running: int | None) -> BatchInfo:
        """Create the batch, or set its limits anew (a rerun may change them); what it spent is kept."""
        info = _batch(batch_id, self._run("set_batch", batch_id, max_total_cost=max_total_cost,
                                          max_running=max_running))
        assert info is not None
        return info

    def batch(self, batch_id: str) -> BatchInfo | None:
        return _batch(batch_id, self._run("batch", batch_id))

    def add_batch_spend(self, batch_id: str, amount: float) -> BatchInfo | None:
        """Add a model call's cost to its batch, atomically (one script): the batch as it is now, None if unknown."""
        return _batch(batch_id, self._run("add_batch_spend", batch_id, amount=float(amount)))

    def batch_jobs(self, batch_id: str) -> "builtins.list[JobRecord]":
        """Every job of the batch, oldest first (one pipeline)."""
        ids = sorted(self._r.smembers(PREFIX + "batchjobs:" + batch_id))
        return sorted((r for r in self._records(ids) if r is not None), key=lambda r: r.created_at)


class RedisDispatch(RedisDb):
    """When each queued job's message was sent: what the reconciler reads (DispatchRecords)."""

    def create_many(self, specs: "builtins.list[JobSpec]", dispatched: bool = False) -> None:
        """Queued worker jobs, in one round trip (a pipeline of create scripts); with `dispatched`, each recorded
        as dispatched now (the caller publishes next). ValueError if one exists already (the others are made)."""
        client, scripts = self._connection()
        pipe = client.pipeline(transaction=False)
        for spec in specs:
            scripts["create"](args=[PREFIX, str(self.retention), spec.id,
                                    json.dumps({"spec": json.dumps(spec.to_dict()), "kind": "worker",
                                                "batch": spec.batch, "dispatched": dispatched}),
                                    uuid.uuid4().hex], client=pipe)
        for reply in pipe.execute(raise_on_error=False):
            if isinstance(reply, Exception):
                raise ValueError(str(reply))

    def mark_dispatched(self, job_id: str, previous: float | None = None, *, only_if: bool = False) -> bool:
        """Record a publish about to happen. With only_if, only if the job is still queued and its last dispatch is
        still `previous`: of several workers re-dispatching one job, one wins."""
        return self._run("mark_dispatched", job_id, previous=repr(previous) if previous is not None else None,
                         only_if=only_if) == 1

    def mark_published(self, job_id: str) -> None:
        self._run("mark_published", job_id)

    def mark_undispatched(self, job_id: str, error: str, parked: bool = False) -> None:
        self._run("mark_undispatched", job_id, error=error[:500], parked=parked)

    def to_dispatch(self, stale_before: float | None) -> "builtins.list[JobRecord]":
        """Queued worker jobs that need a message: never dispatched (or the publish failed), or (with
        stale_before, on the store's clock) dispatched before then and still not taken. Oldest first."""
        ids = self._r.zrange(PREFIX + "st:queued", 0, -1)
        return [r for r in self._records(ids) if r is not None and r.status == "queued" and r.kind == "worker"
                and not r.cancel_requested and (r.dispatched_at is None or
                                                (stale_before is not None and r.dispatched_at < stale_before))]


class RedisHeartbeats(RedisDb):
    """The workers' heartbeats (Heartbeats)."""

    def beat(self, node: str, host: str, pid: int, boot_id: str | None, concurrency: int, running: int,
             taking_jobs: bool, queues: "builtins.list[str] | None" = None,
             policy: dict[str, Any] | None = None, identity: str | None = None,
             alarm: str | None = None, pool: "builtins.list[dict[str, Any]] | None" = None,
             silent_s: float = ALIVE_WITHIN_S) -> None:
        """A worker is alive; `free_since` tracks how long it has had a free slot while taking jobs, `silent_since`
        and `resumed_at` its last silence of over silent_s."""
        self._run("beat", node, host=host, pid=pid, boot_id=boot_id, concurrency=concurrency, running=running,
                  taking_jobs=taking_jobs, queues=",".join(queues or [DEFAULT_QUEUE]),
                  policy=json.dumps(policy or {}), identity=identity, alarm=alarm,
                  pool=json.dumps(pool) if pool else None, silent_s=silent_s)

    def worker_stopped(self, node: str) -> None:
        """The worker stopped cleanly: its heartbeat stays, marked stopped, until forget_silent_workers."""
        self._run("worker_stopped", node)

    def forget_silent_workers(self, silent_s: float = 86400) -> None:
        """Workers not heard from for a day (killed, not stopped) are forgotten."""
        self._run("forget_silent_workers", silent_s=silent_s)

    def workers(self, alive_within_s: float | None = None) -> "builtins.list[WorkerBeat]":
        """Workers by heartbeat, oldest first; with alive_within_s, only those heard from that recently and not
        stopped."""
        nodes = self._r.zrange(PREFIX + "workers", 0, -1)
        pipe = self._r.pipeline(transaction=False)
        for node in nodes:
            pipe.hgetall(PREFIX + "worker:" + node.decode())
        beats = [_beat(f) for f in pipe.execute() if f]
        if alive_within_s is not None:
            since = self.now() - alive_within_s
            beats = [b for b in beats if b.beat_at >= since and b.stopped_at is None]
        return beats


class RedisBlobs(RedisDb):
    """Blobs (BlobStore): a list of chunks under blob:{hex}, pushed to upload:{uuid} and renamed when
    whole."""

    def put_blob(self, stream: BinaryIO) -> str:
        """Store what `stream` holds, sent in BLOB_CHUNK pieces (never whole in memory); returns "sha256:<hex>".
        A reader never sees part of a blob; a blob stored already is kept (the new upload dropped), its TTL renewed."""
        upload = uuid.uuid4().hex
        key = PREFIX + "upload:" + upload
        sha = hashlib.sha256()
        client = self._r
        try:
            first = True
            while True:
                chunk = stream.read(BLOB_CHUNK)
                if not chunk and not first:
                    break
                sha.update(chunk)
                pipe = client.pipeline(transaction=False)
                pipe.rpush(key, chunk)
                pipe.expire(key, UPLOAD_TTL_S)   # from the last chunk: a slow upload lives, a dead one goes
                pipe.execute()
                first = False
                if not chunk:   # an empty blob: one empty chunk (Redis has no empty list)
                    break
            self._run("finish_blob", upload=upload, hex=sha.hexdigest())
        except BaseException:
            try:
                client.delete(key)
            except redis.RedisError:
                pass   # it expires
            raise
        return "sha256:" + sha.hexdigest()

    def put_blob_file(self, path: str, digest: str | None = None) -> str:
        """A file as a blob. With its digest known, a blob already stored is not read nor sent again (its TTL is
        renewed). ValueError if the file's content does not match `digest`."""
        if digest is not None and self._run("touch_blob", hex=blob_hex(digest)) == 1:
            return digest
        return blob_from_file(self, path, digest)

    def has_blob(self, digest: str) -> bool:
        return bool(self._r.exists(PREFIX + "blob:" + blob_hex(digest)))

    def open_blob(self, digest: str) -> Iterator[bytes]:
        """The blob's bytes, in chunks; BlobMissing (now, not on first read) if there is none."""
        key = PREFIX + "blob:" + blob_hex(digest)
        count = self._r.llen(key)
        if not count:
            raise BlobMissing(digest)
        return self._chunks(key, count, digest)

    def _chunks(self, key: str, count: int, digest: str) -> Iterator[bytes]:
        # A Redis restarting while a blob is read (a job's workspace streaming into its sandbox, a download) is
        # waited out chunk by chunk: reading chunk i again is harmless, where the reader could not start over.
        from pid.jobs.outage import Patience
        patience = Patience("", time.monotonic(), who=f"reading blob {digest[:19]}")
        for i in range(count):
            chunk: bytes | None = patience.call(f"chunk {i + 1} of {count}", functools.partial(self._r.lindex, key, i))
            if chunk is None:   # expired while read
                raise BlobMissing(digest)
            if chunk:
                yield chunk

    def pin_blob(self, digest: str) -> bool:
        """Keep a blob past the retention period (False: no such blob)."""
        return self._run("pin_blob", hex=blob_hex(digest)) == 1


class RedisAttachments(RedisBlobs):
    """Per job: its events, artifacts and API key (JobAttachments)."""

    def append_event(self, job_id: str, event: dict[str, Any]) -> int:
        """Add an event to the job's stream; returns its number (1, 2, ...). About the newest `events_kept` are
        kept (XADD MAXLEN ~: Redis trims whole stream nodes, so up to a hundred or so more may remain). KeyError
        for an unknown job."""
        try:
            return int(self._run("append_event", job_id, event=json.dumps(event), kept=self.events_kept))
        except redis.ResponseError as exc:
            if "no job" in str(exc):
                raise KeyError(job_id) from None
            raise

    def events(self, job_id: str, after: int = 0,
               wait_s: float = 0) -> "builtins.list[tuple[int, dict[str, Any]]]":
        """The job's events numbered above `after`, oldest first; with wait_s, waits that long (XREAD BLOCK) for
        one when there is none yet."""
        deadline = time.monotonic() + wait_s
        while True:
            left = deadline - time.monotonic()
            block = max(1, int(min(left, SOCKET_TIMEOUT_S / 2) * 1000)) if left > 0 else None
            replies = self._r.xread({PREFIX + "events:" + job_id: f"{int(after)}-0"}, block=block)
            if replies or deadline - time.monotonic() <= 0:
                break
        found = []
        for _stream, entries in replies or []:
            for entry_id, fields in entries:
                found.append((int(entry_id.split(b"-")[0]), json.loads(fields[b"e"])))
        return found

    def put_artifact(self, job_id: str, name: str, stream: BinaryIO, limit: int = ARTIFACT_LIMIT) -> str:
        """Store a file the job produced under `name` (replacing one of that name); returns its blob digest.
        TooLarge past `limit` bytes (nothing is recorded then); KeyError for an unknown job."""
        check_artifact_name(name)
        if not self._r.exists(PREFIX + "job:" + job_id):
            raise KeyError(job_id)
        digest = self.put_blob(Capped(stream, limit, f"artifact {name!r}"))  # type: ignore[arg-type]
        if self._run("put_artifact", job_id, name=name, digest=digest) != 1:
            raise KeyError(job_id)
        return digest

    def delete_artifact(self, job_id: str, name: str) -> bool:
        """Forget the job's artifact of that name (its blob ages out like any other); False: there was none."""
        return bool(self._r.hdel(PREFIX + "artifacts:" + job_id, name))

    def drop_own_blob(self, job_id: str, digest: str) -> bool:
        """Remove now a blob only this job could have made (a copy of its running transcript, replaced since),
        unless one of the job's artifacts names it (only the job's: no other could hold its bytes); True when
        removed. (Other blobs expire with their TTL.)"""
        if digest.encode() in self._r.hvals(PREFIX + "artifacts:" + job_id):
            return False
        return bool(self._r.delete(PREFIX + "blob:" + blob_hex(digest)))

    def artifact_names(self, job_id: str) -> "builtins.list[str]":
        return sorted(n.decode() for n in self._r.hkeys(PREFIX + "artifacts:" + job_id))

    def open_artifact(self, job_id: str, name: str) -> Iterator[bytes]:
        """The artifact's bytes in chunks; BlobMissing if the job has none by that name."""
        digest = self._r.hget(PREFIX + "artifacts:" + job_id, name)
        if digest is None:
            raise BlobMissing(f"{job_id}: {name}")
        return self.open_blob(digest.decode())

    def set_secret(self, job_id: str, api_key: str) -> bool:
        """The job's API key, kept only while it is queued or running (its end deletes it); never in its record.
        False if the job is unknown or ended."""
        return self._run("set_secret", job_id, api_key=api_key) == 1

    def secret(self, job_id: str) -> str | None:
        value = self._r.get(PREFIX + "secret:" + job_id)
        return value.decode() if value is not None else None


class RedisRetention(RedisDb):
    """Forgetting ended jobs after PID_RETENTION (Retention): their keys expire, this drops their
    index entries."""

    def prune(self) -> dict[str, int]:
        """Redis expires ended jobs and blobs itself (TTLs); this drops the index entries of jobs that expired."""
        before = self.now() - self.retention
        ids = self._r.zrangebyscore(PREFIX + "ended", "-inf", before)
        pipe = self._r.pipeline(transaction=False)
        for job_id in ids:
            pipe.exists(PREFIX + "job:" + job_id.decode())
        gone = [i for i, exists in zip(ids, pipe.execute()) if not exists]
        self._drop_from_indexes(gone)
        return {"jobs": len(gone), "blobs": 0}


class RedisStore(RedisRecords, RedisLeases, RedisRecovery, RedisBatches, RedisDispatch,
                 RedisHeartbeats, RedisAttachments, RedisBlobs, RedisRetention):
    """The job store in Redis (see the module's docstring): one class per role of jobs/store.py's `Store`.
    `RedisStore(url)` connects on first use."""


def _decoded(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _text(fields: dict[bytes, bytes], name: str) -> str | None:
    value = fields.get(name.encode())
    return value.decode() if value is not None else None


def _record(fields: dict[bytes, bytes]) -> JobRecord:
    t = {k: _text(fields, k) for k in ("id", "spec", "status", "owner", "cancel_requested", "paused", "exit_reason",
                                       "error", "kind", "usage", "earlier", "activity", "last_tool", "dispatch_error",
                                       "check")}
    floats = {k: (float(v) if (v := _text(fields, k)) is not None else None) for k in _FLOATS}
    ints = {k: int(_text(fields, k) or 0) for k in _INTS}
    earlier = json.loads(t["earlier"] or "[]")
    for entry in earlier:   # the script keeps the usage as recorded; the record gives it in result.json's shape
        entry["usage"] = sum_usage(entry.get("usage") or {})
    assert t["id"] is not None and t["spec"] is not None and t["status"] is not None
    return JobRecord(t["id"], JobSpec.from_dict(json.loads(t["spec"])), t["status"], t["owner"],
                     floats["lease_until"], ints["attempts"], t["cancel_requested"] == "1", t["paused"] == "1",
                     ints["turns"], ints["tool_calls"], t["exit_reason"], t["error"], floats["created_at"] or 0.0,
                     floats["started_at"], floats["finished_at"], t["kind"] or "worker",
                     json.loads(t["usage"] or "{}"), earlier, t["activity"], t["last_tool"], floats["updated_at"],
                     floats["claimed_at"], ints["handbacks"], floats["dispatched_at"], t["dispatch_error"],
                     floats["undispatched_since"], json.loads(t["check"]) if t["check"] else None)


def _batch(batch_id: str, found: Any) -> BatchInfo | None:
    if not found:
        return None
    cost, running_max, spent, running = found
    return BatchInfo(batch_id, float(cost) if cost else None, int(running_max) if running_max else None,
                     round(float(spent), 9), int(running))


def _beat(fields: dict[bytes, bytes]) -> WorkerBeat:
    free, stopped = _text(fields, "free_since"), _text(fields, "stopped_at")
    silent, resumed = _text(fields, "silent_since"), _text(fields, "resumed_at")
    return WorkerBeat(_text(fields, "node") or "", _text(fields, "host") or "", int(_text(fields, "pid") or 0),
                      _text(fields, "boot_id"), int(_text(fields, "concurrency") or 0),
                      int(_text(fields, "running") or 0), float(free) if free is not None else None,
                      float(_text(fields, "started_at") or 0), float(_text(fields, "beat_at") or 0),
                      _queues(_text(fields, "queues")), _policy(_text(fields, "policy")), _text(fields, "identity"),
                      float(stopped) if stopped is not None else None, _text(fields, "alarm"),
                      _pool(_text(fields, "pool")), float(silent) if silent is not None else None,
                      float(resumed) if resumed is not None else None)
