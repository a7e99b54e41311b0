-- controls.lua: What a running job's worker asks each turn, in one read: does it still hold the job, was a cancel asked,
-- is it paused, are messages waiting. Read only (no once.lua). One script so the four answers are of one moment.
local h = redis.call('HMGET', K, 'status', 'owner', 'cancel_requested', 'paused', 'inbox_taken')
if not h[1] then return false end
return {h[1] == 'running' and h[2] == A.owner and 1 or 0, h[3] == '1' and 1 or 0, h[4] == '1' and 1 or 0,
  redis.call('LLEN', P .. 'inbox:' .. ID) > (tonumber(h[5]) or 0) and 1 or 0}
