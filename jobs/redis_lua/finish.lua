-- finish.lua: Records a queued or running job's ending, once: its status, reason, counts, check; then ended() drops its
-- API key and sets its keys' TTLs. With an owner only the lease holder may; `returning` (with its owner): a `pid run`
-- the sweep ended client_lost, its machine away past the grace, ends its job truly. With lapsed_only only while nobody
-- holds a live lease. Atomic: of the worker's own finish and a sweeper's, exactly one records the ending, and a lease
-- just renewed is never ended by the sweeper.
local status = field('status')
if A.returning and not isnull(A.owner) then
  if field('kind') ~= 'run' or field('exit_reason') ~= 'client_lost' then return 0 end
elseif not active(status) then return 0 end
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
