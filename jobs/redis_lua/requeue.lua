-- requeue.lua: requeue (the job's process is lost) and hand_back (a stopping worker gives its job back with its counts): a
-- running job goes back to the queue, or ends `cancelled` if that was asked. With an owner only if that process still
-- holds it; with lapsed_only only while its lease has lapsed. Returns the status now (nil: not done). Atomic: a job
-- whose worker renewed or finished meanwhile is never taken from it.
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
