-- create.lua: A new queued job: its hash, its places in the indexes (jobs, st:queued, rids) and, in a batch, the batch's
-- set of jobs. An id that exists is an error. Atomic: no reader sees a job half indexed, and of two creates of one
-- id exactly one succeeds.
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
