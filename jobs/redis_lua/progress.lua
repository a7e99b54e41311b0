-- progress.lua: The running attempt's counts so far (turns, tool calls, usage, activity, last tool), and the lease renewed
-- when lease_s is given. Holder only; atomic so an attempt that lost the job cannot write over its new owner's counts.
if field('status') ~= 'running' or field('owner') ~= A.owner then return 0 end
local t = now()
redis.call('HSET', K, 'turns', A.turns, 'tool_calls', A.tool_calls, 'updated_at', fmt(t))
if not isnull(A.usage) then redis.call('HSET', K, 'usage', A.usage) end
set_or_del('activity', A.activity)
if not isnull(A.last_tool) then redis.call('HSET', K, 'last_tool', A.last_tool) end
if not isnull(A.lease_s) then redis.call('HSET', K, 'lease_until', fmt(t + A.lease_s)) end
return 1
