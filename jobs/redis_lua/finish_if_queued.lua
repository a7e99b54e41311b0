-- finish_if_queued.lua: Ends a job that is still queued (no worker took it), with the given reason. Atomic: a job claimed
-- meanwhile is left to its worker.
local status = field('status')
if status ~= 'queued' then return 0 end
local t = now()
redis.call('HSET', K, 'exit_reason', A.exit_reason, 'finished_at', fmt(t))
set_or_del('error', A.error)
move(status, A.status)
ended(t)
return 1
