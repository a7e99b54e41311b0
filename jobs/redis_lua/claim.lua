-- claim.lua: A worker takes a job that is queued, or running under a lapsed lease (by the server's clock), unless a
-- cancel was asked or its batch is at its spending or running limit; an earlier attempt's counts go to `earlier`, and
-- its messages are to be taken again.
-- Returns 1 when taken. Atomic: the checks and the taking are one step, so exactly one claimer wins and a batch's
-- max_running is never passed by two claims at once.
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
  redis.call('HDEL', K, 'inbox_taken')   -- it starts the conversation again: every message is its to take again
end
redis.call('HSET', K, 'owner', A.owner, 'lease_until', fmt(t + A.lease_s), 'attempts', attempts + 1,
  'turns', 0, 'tool_calls', 0, 'updated_at', fmt(t), 'claimed_at', fmt(t))
if field('started_at') == nil then redis.call('HSET', K, 'started_at', fmt(t)) end
redis.call('HDEL', K, 'usage', 'activity', 'last_tool')
move(status, 'running')
return 1
