-- request_cancel.lua: Asks a queued or running job to cancel: a queued one is cancelled on the spot, a running one is marked
-- for its worker to stop. Returns the status now. Atomic: a job cannot be claimed between the check and the cancel.
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
