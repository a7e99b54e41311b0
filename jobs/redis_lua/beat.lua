-- beat.lua: A worker's heartbeat (ID: its node name): its hash is made on the first beat, then updated; free_since tracks
-- how long it has had a free slot while taking jobs; a silence of over silent_s from the same process is kept, from its
-- beat before (silent_since) to this one (resumed_at). Atomic: a beat never leaves a half-written worker to a reader.
local key = P .. 'worker:' .. ID
local t = now()
local was = redis.call('HMGET', key, 'beat_at', 'identity', 'stopped_at')
if was[1] and was[2] and not was[3] and was[2] == A.identity and t - tonumber(was[1]) > A.silent_s then
  redis.call('HSET', key, 'silent_since', was[1], 'resumed_at', fmt(t))
end
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
if isnull(A.pool) then redis.call('HDEL', key, 'pool') else redis.call('HSET', key, 'pool', A.pool) end
if isnull(A.identity) then redis.call('HDEL', key, 'identity') else redis.call('HSET', key, 'identity', A.identity) end
if not free then redis.call('HDEL', key, 'free_since')
elseif redis.call('HEXISTS', key, 'free_since') == 0 then redis.call('HSET', key, 'free_since', fmt(t)) end
return 1
