"""The job store in Redis: the same semantics as the SQLite JobStore (worker/store.py), for workers and clients on
several machines that share nothing but a Redis.

Atomicity: every operation that reads a job's state and changes it is one Lua script (redis-py `register_script`),
which Redis runs alone: a claim, a renewal, a finish, a requeue can never interleave with another; a script sent
again by redis-py after a lost reply does not run twice (_ONCE). Reads that only read (get, list, lapsed,
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
import hashlib
import json
import os
import time
import uuid
from typing import Any, BinaryIO, Iterator

import redis

from pid.endings import ExitReason, status_of
from worker.brokers import shown_url
from worker.jobs import DEFAULT_QUEUE, JobSpec
from worker.store import (ARTIFACT_LIMIT, BLOB_CHUNK, EVENTS_KEPT, BatchInfo, BlobMissing, Capped, Controls, JobRecord,
                          WorkerBeat, _policy, _queues, blob_from_file, blob_hex, check_artifact_name, retention_s,
                          sum_usage)

PREFIX = "pid:"
SOCKET_TIMEOUT_S = 60  # a Redis that stopped answering is an error, not a hang (a blocking read waits less)
UPLOAD_TTL_S = 3600    # an upload's temporary key vanishes an hour after its writer stopped sending

# Shared by the scripts. ARGV[1]: the key prefix, ARGV[2]: the retention (s), ARGV[3]: the job id, ARGV[4]: the
# operation's arguments as a JSON object (null: None), ARGV[5]: the call's token (_ONCE). Times are written "%.6f".
_PRELUDE = r"""
local P, RET, ID = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local A = cjson.decode(ARGV[4])
local K = P .. 'job:' .. ID
local function now() local t = redis.call('TIME'); return tonumber(t[1]) + tonumber(t[2]) / 1000000 end
local function fmt(x) return string.format('%.6f', x) end
local function isnull(v) return v == nil or v == cjson.null end
local function field(f) local v = redis.call('HGET', K, f); if v == false then return nil end; return v end
local function set_or_del(f, v) if isnull(v) then redis.call('HDEL', K, f) else redis.call('HSET', K, f, v) end end
local function set_or_del_in(key, f, v)
  if isnull(v) then redis.call('HDEL', key, f) else redis.call('HSET', key, f, tostring(v)) end
end
local function active(status) return status == 'queued' or status == 'running' end
local function move(old, new)
  if old ~= new then
    local created = tonumber(field('created_at'))
    redis.call('ZREM', P .. 'st:' .. old, ID)
    redis.call('ZADD', P .. 'st:' .. new, created, ID)
    redis.call('HSET', K, 'status', new)
  end
end
-- A batch's limits and spend, and how many of its jobs run (`besides` left out); its running set is pruned as read.
local function batch_info(b, besides)
  local BK = P .. 'batch:' .. b
  local h = redis.call('HMGET', BK, 'max_total_cost', 'max_running', 'spent', 'created_at')
  if not h[4] then return nil end
  local RK = P .. 'batchrun:' .. b
  local n = 0
  for _, j in ipairs(redis.call('SMEMBERS', RK)) do
    if redis.call('HGET', P .. 'job:' .. j, 'status') == 'running' then
      if j ~= besides then n = n + 1 end
    else redis.call('SREM', RK, j) end
  end
  return {h[1] or false, h[2] or false, h[3] or '0', n}
end
local function batch_ttl(b)
  local ttl = math.max(1, math.floor(RET)) + 86400
  for _, k in ipairs({P .. 'batch:' .. b, P .. 'batchjobs:' .. b, P .. 'batchrun:' .. b}) do
    redis.call('EXPIRE', k, ttl)
  end
end
-- A job has just ended: its API key goes, its data expires (unless pinned), its artifacts' blobs live as long at least.
local function ended(t)
  redis.call('ZADD', P .. 'ended', t, ID)
  redis.call('DEL', P .. 'secret:' .. ID)
  if field('pinned') == '1' then return end
  local ttl = math.max(1, math.floor(RET))
  for _, k in ipairs({K, P .. 'inbox:' .. ID, P .. 'events:' .. ID, P .. 'evseq:' .. ID, P .. 'artifacts:' .. ID}) do
    redis.call('EXPIRE', k, ttl)
  end
  local digests = redis.call('HVALS', P .. 'artifacts:' .. ID)
  for _, d in ipairs(digests) do redis.call('EXPIRE', P .. 'blob:' .. string.sub(d, 8), ttl, 'GT') end
end
"""

_SCRIPTS: dict[str, str] = {
    "create": r"""
if redis.call('EXISTS', K) == 1 then return redis.error_reply('job ' .. ID .. ' exists') end
local t = now()
redis.call('HSET', K, 'id', ID, 'spec', A.spec, 'status', 'queued', 'attempts', 0, 'cancel_requested', 0,
  'paused', 0, 'turns', 0, 'tool_calls', 0, 'created_at', fmt(t), 'kind', A.kind, 'handbacks', 0,
  'undispatched_since', fmt(t), 'pinned', 0)
redis.call('ZADD', P .. 'jobs', t, ID)
redis.call('ZADD', P .. 'st:queued', t, ID)
redis.call('ZADD', P .. 'rids', 0, string.reverse(ID))
if A.dispatched then
  redis.call('HSET', K, 'dispatched_at', fmt(t))
  redis.call('HDEL', K, 'undispatched_since')
end
if not isnull(A.batch) then
  redis.call('HSET', K, 'batch', A.batch)
  redis.call('SADD', P .. 'batchjobs:' .. A.batch, ID)
  batch_ttl(A.batch)
end
return 1
""",
    "claim": r"""
local status = field('status')
if status == nil or field('cancel_requested') == '1' then return 0 end
local t = now()
if not (status == 'queued' or (status == 'running' and (tonumber(field('lease_until')) or 0) < t)) then return 0 end
local batch = field('batch')
if batch ~= nil then
  local b = batch_info(batch, ID)
  if b then
    if b[1] and tonumber(b[3]) >= tonumber(b[1]) then return 0 end
    if b[2] and b[4] >= tonumber(b[2]) then return 0 end
  end
  redis.call('SADD', P .. 'batchrun:' .. batch, ID)
end
local attempts = tonumber(field('attempts'))
if attempts > 0 then
  local entry = '{"attempt":' .. attempts .. ',"turns":' .. field('turns') .. ',"tool_calls":' ..
    field('tool_calls') .. ',"usage":' .. (field('usage') or '{}') .. '}'
  local earlier = field('earlier')
  if earlier == nil or earlier == '[]' then earlier = '[' .. entry .. ']'
  else earlier = string.sub(earlier, 1, -2) .. ',' .. entry .. ']' end
  redis.call('HSET', K, 'earlier', earlier)
end
redis.call('HSET', K, 'owner', A.owner, 'lease_until', fmt(t + A.lease_s), 'attempts', attempts + 1,
  'turns', 0, 'tool_calls', 0, 'updated_at', fmt(t), 'claimed_at', fmt(t))
if field('started_at') == nil then redis.call('HSET', K, 'started_at', fmt(t)) end
redis.call('HDEL', K, 'usage', 'activity')
move(status, 'running')
return 1
""",
    "controls": r"""
local h = redis.call('HMGET', K, 'status', 'owner', 'cancel_requested', 'paused')
if not h[1] then return false end
return {h[1] == 'running' and h[2] == A.owner and 1 or 0, h[3] == '1' and 1 or 0, h[4] == '1' and 1 or 0,
  redis.call('EXISTS', P .. 'inbox:' .. ID)}
""",
    "renew": r"""
if field('status') ~= 'running' or field('owner') ~= A.owner then return 0 end
redis.call('HSET', K, 'lease_until', fmt(now() + A.lease_s))
return 1
""",
    "progress": r"""
if field('status') ~= 'running' or field('owner') ~= A.owner then return 0 end
local t = now()
redis.call('HSET', K, 'turns', A.turns, 'tool_calls', A.tool_calls, 'updated_at', fmt(t))
if not isnull(A.usage) then redis.call('HSET', K, 'usage', A.usage) end
set_or_del('activity', A.activity)
if not isnull(A.last_tool) then redis.call('HSET', K, 'last_tool', A.last_tool) end
if not isnull(A.lease_s) then redis.call('HSET', K, 'lease_until', fmt(t + A.lease_s)) end
return 1
""",
    "finish": r"""
local status = field('status')
if not active(status) then return 0 end
if not isnull(A.owner) and field('owner') ~= A.owner then return 0 end
local t = now()
if A.lapsed_only then
  local lease = tonumber(field('lease_until'))
  if lease ~= nil and lease >= t then return 0 end
end
redis.call('HSET', K, 'exit_reason', A.exit_reason, 'finished_at', fmt(t))
set_or_del('error', A.error)
if not isnull(A.turns) then redis.call('HSET', K, 'turns', A.turns) end
if not isnull(A.tool_calls) then redis.call('HSET', K, 'tool_calls', A.tool_calls) end
if not isnull(A.usage) then redis.call('HSET', K, 'usage', A.usage) end
set_or_del('check', A.check)
redis.call('HDEL', K, 'lease_until', 'activity')
move(status, A.status)
ended(t)
return 1
""",
    "finish_if_queued": r"""
local status = field('status')
if status ~= 'queued' then return 0 end
local t = now()
redis.call('HSET', K, 'exit_reason', A.exit_reason, 'finished_at', fmt(t))
move(status, A.status)
ended(t)
return 1
""",
    "request_cancel": r"""
local status = field('status')
if status == nil then return false end
if active(status) then redis.call('HSET', K, 'cancel_requested', 1) end
if status == 'queued' then
  local t = now()
  redis.call('HSET', K, 'exit_reason', 'cancelled', 'finished_at', fmt(t))
  move(status, A.status)
  ended(t)
end
return field('status')
""",
    "set_paused": r"""
if not active(field('status')) then return 0 end
redis.call('HSET', K, 'paused', A.paused)
return 1
""",
    "post": r"""
if not active(field('status')) then return 0 end
redis.call('RPUSH', P .. 'inbox:' .. ID, cjson.encode({A.kind, A.text}))
return 1
""",
    "take_messages": r"""
local key = P .. 'inbox:' .. ID
local messages = redis.call('LRANGE', key, 0, -1)
redis.call('DEL', key)
return messages
""",
    # requeue (lost process) and hand_back (a stopping worker): back to the queue, or `cancelled` if that was asked.
    "requeue": r"""
local status = field('status')
if status ~= 'running' then return false end
if not isnull(A.owner) and field('owner') ~= A.owner then return false end
local t = now()
if A.lapsed_only then
  local lease = tonumber(field('lease_until'))
  if lease == nil or lease >= t then return false end
end
if A.handback then
  redis.call('HINCRBY', K, 'handbacks', 1)
  redis.call('HSET', K, 'turns', A.turns, 'tool_calls', A.tool_calls)
  if not isnull(A.usage) then redis.call('HSET', K, 'usage', A.usage) end
end
redis.call('HDEL', K, 'owner', 'lease_until', 'activity', 'dispatched_at')
redis.call('HSET', K, 'undispatched_since', fmt(t))
if field('cancel_requested') == '1' then
  redis.call('HSET', K, 'exit_reason', 'cancelled', 'finished_at', fmt(t))
  move(status, A.cancelled_status)
  ended(t)
else
  redis.call('HDEL', K, 'exit_reason', 'finished_at')
  move(status, 'queued')
end
return field('status')
""",
    "mark_dispatched": r"""
local status = field('status')
if not active(status) then return 0 end
if A.only_if then
  if status ~= 'queued' then return 0 end
  local at = tonumber(field('dispatched_at'))
  if isnull(A.previous) then
    if at ~= nil then return 0 end
  elseif at == nil or at ~= tonumber(A.previous) then return 0 end
end
redis.call('HSET', K, 'dispatched_at', fmt(now()))
return 1
""",
    "mark_published": r"""
redis.call('HDEL', K, 'dispatch_error', 'undispatched_since')
return 1
""",
    "mark_undispatched": r"""
if field('status') ~= 'queued' then return 0 end
redis.call('HDEL', K, 'dispatched_at')
redis.call('HSET', K, 'dispatch_error', A.error)
if field('undispatched_since') == nil then redis.call('HSET', K, 'undispatched_since', fmt(now())) end
return 1
""",
    # batches: ID is the batch's id here
    "set_batch": r"""
local BK = P .. 'batch:' .. ID
if redis.call('EXISTS', BK) == 0 then redis.call('HSET', BK, 'spent', '0', 'created_at', fmt(now())) end
set_or_del_in(BK, 'max_total_cost', A.max_total_cost)
set_or_del_in(BK, 'max_running', A.max_running)
batch_ttl(ID)
return batch_info(ID, nil)
""",
    "add_batch_spend": r"""
local BK = P .. 'batch:' .. ID
if redis.call('EXISTS', BK) == 0 then return false end
redis.call('HINCRBYFLOAT', BK, 'spent', A.amount)
batch_ttl(ID)
return batch_info(ID, nil)
""",
    "batch": r"""
return batch_info(ID, nil) or false
""",
    "pin_job": r"""
if redis.call('EXISTS', K) == 0 then return 0 end
redis.call('HSET', K, 'pinned', 1)
for _, k in ipairs({K, P .. 'inbox:' .. ID, P .. 'events:' .. ID, P .. 'evseq:' .. ID, P .. 'artifacts:' .. ID}) do
  redis.call('PERSIST', k)
end
for _, d in ipairs(redis.call('HVALS', P .. 'artifacts:' .. ID)) do
  redis.call('PERSIST', P .. 'blob:' .. string.sub(d, 8))
end
return 1
""",
    "append_event": r"""
if redis.call('EXISTS', K) == 0 then return redis.error_reply('no job ' .. ID) end
local n = redis.call('INCR', P .. 'evseq:' .. ID)
local key = P .. 'events:' .. ID
redis.call('XADD', key, 'MAXLEN', '~', A.kept, n .. '-0', 'e', A.event)
local ttl = redis.call('TTL', K)
if ttl > 0 then
  redis.call('EXPIRE', key, ttl)
  redis.call('EXPIRE', P .. 'evseq:' .. ID, ttl)
end
return n
""",
    "put_artifact": r"""
if redis.call('EXISTS', K) == 0 then return 0 end
local key = P .. 'artifacts:' .. ID
redis.call('HSET', key, A.name, A.digest)
local blob = P .. 'blob:' .. string.sub(A.digest, 8)
if field('pinned') == '1' then redis.call('PERSIST', blob) else
  local ttl = redis.call('TTL', K)
  if ttl > 0 then
    redis.call('EXPIRE', key, ttl)
    redis.call('EXPIRE', blob, ttl, 'GT')
  end
end
return 1
""",
    "set_secret": r"""
if not active(field('status')) then return 0 end
redis.call('SET', P .. 'secret:' .. ID, A.api_key)
return 1
""",
    "beat": r"""
local key = P .. 'worker:' .. ID
local t = now()
local free = A.taking_jobs and A.running < A.concurrency
if redis.call('EXISTS', key) == 0 then
  redis.call('HSET', key, 'node', ID, 'host', A.host, 'pid', A.pid, 'started_at', fmt(t))
  redis.call('ZADD', P .. 'workers', t, ID)
end
redis.call('HSET', key, 'concurrency', A.concurrency, 'running', A.running, 'beat_at', fmt(t), 'queues', A.queues,
  'policy', A.policy)
redis.call('HDEL', key, 'stopped_at')
if isnull(A.boot_id) then redis.call('HDEL', key, 'boot_id') else redis.call('HSET', key, 'boot_id', A.boot_id) end
if isnull(A.alarm) then redis.call('HDEL', key, 'alarm') else redis.call('HSET', key, 'alarm', A.alarm) end
if isnull(A.identity) then redis.call('HDEL', key, 'identity') else redis.call('HSET', key, 'identity', A.identity) end
if not free then redis.call('HDEL', key, 'free_since')
elseif redis.call('HEXISTS', key, 'free_since') == 0 then redis.call('HSET', key, 'free_since', fmt(t)) end
return 1
""",
    "worker_stopped": r"""
local key = P .. 'worker:' .. ID
if redis.call('EXISTS', key) == 0 then return 0 end
redis.call('HSET', key, 'stopped_at', fmt(now()), 'running', 0)
redis.call('HDEL', key, 'free_since')
return 1
""",
    "forget_silent_workers": r"""
local before = now() - A.silent_s
for _, node in ipairs(redis.call('ZRANGE', P .. 'workers', 0, -1)) do
  local key = P .. 'worker:' .. node
  local beat = tonumber(redis.call('HGET', key, 'beat_at') or '0')
  if beat < before then
    redis.call('DEL', key)
    redis.call('ZREM', P .. 'workers', node)
  end
end
return 1
""",
    # blob:{hex} appears whole, by a RENAME of the finished upload, or not at all; a second upload of it is dropped.
    "finish_blob": r"""
local tmp, final = P .. 'upload:' .. A.upload, P .. 'blob:' .. A.hex
local ttl = math.max(1, math.floor(RET))
if redis.call('EXISTS', final) == 1 then
  redis.call('DEL', tmp)
  redis.call('EXPIRE', final, ttl, 'GT')
  return 0
end
if redis.call('EXISTS', tmp) == 0 then return redis.error_reply('upload ' .. A.upload .. ' expired') end
redis.call('RENAME', tmp, final)
if redis.call('SISMEMBER', P .. 'pins', A.hex) == 1 then redis.call('PERSIST', final)
else redis.call('EXPIRE', final, ttl) end
return 1
""",
    "touch_blob": r"""
local key = P .. 'blob:' .. A.hex
if redis.call('EXISTS', key) == 0 then return 0 end
redis.call('EXPIRE', key, math.max(1, math.floor(RET)), 'GT')
return 1
""",
    "pin_blob": r"""
local key = P .. 'blob:' .. A.hex
if redis.call('EXISTS', key) == 0 then return 0 end
redis.call('SADD', P .. 'pins', A.hex)
redis.call('PERSIST', key)
return 1
""",
}

# redis-py sends a command again when the connection breaks before its reply (its default Retry): a script that
# ran but whose reply was lost would run twice (a claim refused to its own claimer, messages taken twice, i.e. lost).
# So each call of a script that writes carries a token (ARGV[5]); its result is kept under done:{token} for ten
# minutes and a second run with that token returns it without doing anything.
_ONCE = r"""
local DONE = P .. 'done:' .. ARGV[5]
local prior = redis.call('GET', DONE)
if prior then return cjson.decode(prior)[1] end
local result = (function()
%s
end)()
redis.call('SET', DONE, cjson.encode({result}), 'EX', 600)
return result
"""
_READ_ONLY = {"controls"}

# Fields of a record that are numbers; the others are strings (absent: None).
_FLOATS = ("lease_until", "created_at", "started_at", "finished_at", "updated_at", "claimed_at", "dispatched_at",
           "undispatched_since")
_INTS = ("attempts", "turns", "tool_calls", "handbacks")


class RedisStore:
    """The job store in Redis (see the module's docstring). `RedisStore(url)` connects on first use."""

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
            scripts = {name: client.register_script(_PRELUDE + (body if name in _READ_ONLY else _ONCE % body))
                       for name, body in _SCRIPTS.items()}
            state = self._state = (os.getpid(), client, scripts)
        return state[1], state[2]

    def client(self) -> Any:
        """This process's redis-py client (the broker's too when it is the same Redis: worker/dispatch.py)."""
        return self._connection()[0]

    @property
    def _r(self) -> Any:
        """The client (Any: redis-py's stubs type replies as bytes | str; with decode_responses off they are
        bytes)."""
        return self.client()

    def _run(self, script: str, job_id: str = "", /, **args: Any) -> Any:
        client, scripts = self._connection()
        return scripts[script](args=[PREFIX, str(self.retention), job_id, json.dumps(args), uuid.uuid4().hex],
                               client=client)

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

    # -- jobs ------------------------------------------------------------------------------------------------------

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

    def get(self, job_id: str) -> JobRecord | None:
        fields = self._r.hgetall(PREFIX + "job:" + job_id)
        return _record(fields) if fields else None

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
               lapsed_only: bool = False, check: dict[str, Any] | None = None) -> bool:
        """Record the ending, once (`check`: result.json's, when the job's check ran). With an owner, only the lease
        holder may; with lapsed_only, only while nobody holds a live lease. The job's API key is deleted; its keys
        expire after the retention period."""
        return self._run("finish", job_id, exit_reason=exit_reason, status=status_of(exit_reason), owner=owner,
                         error=error, turns=turns, tool_calls=tool_calls,
                         usage=json.dumps(usage) if usage is not None else None, lapsed_only=lapsed_only,
                         check=json.dumps(check) if check is not None else None) == 1

    def request_cancel(self, job_id: str) -> str | None:
        """Ask for a cancel. A queued job is cancelled on the spot; a running one by its worker. Returns the status."""
        status = self._run("request_cancel", job_id, status=status_of("cancelled"))
        return status.decode() if status else None

    def finish_if_queued(self, job_id: str, exit_reason: ExitReason) -> bool:
        return self._run("finish_if_queued", job_id, exit_reason=exit_reason, status=status_of(exit_reason)) == 1

    def set_paused(self, job_id: str, paused: bool) -> bool:
        return self._run("set_paused", job_id, paused=int(paused)) == 1

    def post(self, job_id: str, kind: str, text: str) -> bool:
        """Queue a steering or follow-up message for a queued or running job."""
        assert kind in ("steer", "follow_up")
        return self._run("post", job_id, kind=kind, text=text) == 1

    def take_messages(self, job_id: str) -> "builtins.list[tuple[str, str]]":
        """Undelivered messages in the order they were posted, taken (delivered) at once."""
        return [(kind, text) for kind, text in map(json.loads, self._run("take_messages", job_id))]

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

    def hand_back(self, job_id: str, owner: str, turns: int, tool_calls: int,
                  usage: dict[str, Any] | None) -> str | None:
        """A stopping worker gives its running job back to the queue with this attempt's counts; not a loss.
        Returns the job's status now (None: this owner no longer held it)."""
        status = self._run("requeue", job_id, owner=owner, lapsed_only=False, handback=True, turns=turns,
                           tool_calls=tool_calls, usage=json.dumps(usage) if usage is not None else None,
                           cancelled_status=status_of("cancelled"))
        return status.decode() if status else None

    def pin_job(self, job_id: str) -> bool:
        """Keep this job (its keys, its artifacts' blobs) past the retention period."""
        return self._run("pin_job", job_id) == 1

    # -- batches ----------------------------------------------------------------------------------------------

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

    # -- dispatch records --------------------------------------------------------------------------------------

    def mark_dispatched(self, job_id: str, previous: float | None = None, *, only_if: bool = False) -> bool:
        """Record a publish about to happen. With only_if, only if the job is still queued and its last dispatch is
        still `previous`: of several workers re-dispatching one job, one wins."""
        return self._run("mark_dispatched", job_id, previous=repr(previous) if previous is not None else None,
                         only_if=only_if) == 1

    def mark_published(self, job_id: str) -> None:
        self._run("mark_published", job_id)

    def mark_undispatched(self, job_id: str, error: str) -> None:
        self._run("mark_undispatched", job_id, error=error[:500])

    def to_dispatch(self, stale_before: float | None) -> "builtins.list[JobRecord]":
        """Queued worker jobs that need a message: never dispatched (or the publish failed), or (with
        stale_before, on the store's clock) dispatched before then and still not taken. Oldest first."""
        ids = self._r.zrange(PREFIX + "st:queued", 0, -1)
        return [r for r in self._records(ids) if r is not None and r.status == "queued" and r.kind == "worker"
                and not r.cancel_requested and (r.dispatched_at is None or
                                                (stale_before is not None and r.dispatched_at < stale_before))]

    # -- worker heartbeats -----------------------------------------------------------------------------------------

    def beat(self, node: str, host: str, pid: int, boot_id: str | None, concurrency: int, running: int,
             taking_jobs: bool, queues: "builtins.list[str] | None" = None,
             policy: dict[str, Any] | None = None, identity: str | None = None,
             alarm: str | None = None) -> None:
        """A worker is alive; `free_since` tracks how long it has had a free slot while taking jobs."""
        self._run("beat", node, host=host, pid=pid, boot_id=boot_id, concurrency=concurrency, running=running,
                  taking_jobs=taking_jobs, queues=",".join(queues or [DEFAULT_QUEUE]),
                  policy=json.dumps(policy or {}), identity=identity, alarm=alarm)

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

    # -- blobs: a list of chunks under blob:{hex}, pushed to upload:{uuid} and renamed when whole ---------------

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
        for i in range(count):
            chunk = self._r.lindex(key, i)
            if chunk is None:   # expired while read
                raise BlobMissing(digest)
            if chunk:
                yield chunk

    def pin_blob(self, digest: str) -> bool:
        """Keep a blob past the retention period (False: no such blob)."""
        return self._run("pin_blob", hex=blob_hex(digest)) == 1

    # -- per job: events, artifacts, API key -------------------------------------------------------------------

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

    # -- retention -------------------------------------------------------------------------------------------------

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
    return WorkerBeat(_text(fields, "node") or "", _text(fields, "host") or "", int(_text(fields, "pid") or 0),
                      _text(fields, "boot_id"), int(_text(fields, "concurrency") or 0),
                      int(_text(fields, "running") or 0), float(free) if free is not None else None,
                      float(_text(fields, "started_at") or 0), float(_text(fields, "beat_at") or 0),
                      _queues(_text(fields, "queues")), _policy(_text(fields, "policy")), _text(fields, "identity"),
                      float(stopped) if stopped is not None else None, _text(fields, "alarm"))
