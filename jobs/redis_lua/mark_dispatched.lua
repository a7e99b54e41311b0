-- mark_dispatched.lua: Records that a queue message for the job is about to be published. With only_if, only if the job is
-- still queued and its last dispatch is still `previous`. Atomic: of several workers re-dispatching one job, one wins.
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
