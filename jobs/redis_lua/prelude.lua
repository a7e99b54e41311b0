-- prelude.lua: Shared by every script (prepended to each when it is registered): the arguments and the helpers.
-- ARGV[1]: the key prefix, ARGV[2]: the retention (s), ARGV[3]: the job id (a batch's or a worker's for their
-- scripts), ARGV[4]: the operation's arguments as a JSON object (null: None), ARGV[5]: the call's token and ARGV[6]
-- how long its result is kept (once.lua).
-- Times are the Redis server's clock (TIME), written "%.6f". Not a script of its own: it runs inside each one, so
-- inside that script's atomic step.
local P, RET, ID = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local A = cjson.decode(ARGV[4])
local K = P .. 'job:' .. ID
local function now() local t = redis.call('TIME'); return tonumber(t[1]) + tonumber(t[2]) / 1000000 end
local function fmt(x) return string.format('%.6f', x) end
local function isnull(v) return v == nil or v == cjson.null end
local function field(f) local v = redis.call('HGET', K, f); if v == false then return nil end; return v end
local function set_or_del(f, v) if isnull(v) then redis.call('HDEL', K, f) else redis.call('HSET', K, f, v) end end
local function set_or_del_in(key, f, v)
  if isnull(v) then redis.call('HDEL', key, f) else redis.call('HSET', key, f, tostring(v)) end
end
local function active(status) return status == 'queued' or status == 'running' end
local function move(old, new)
  if old ~= new then
    local created = tonumber(field('created_at'))
    redis.call('ZREM', P .. 'st:' .. old, ID)
    redis.call('ZADD', P .. 'st:' .. new, created, ID)
    redis.call('HSET', K, 'status', new)
  end
end
-- A batch's limits and spend, and how many of its jobs run (`besides` left out); its running set is pruned as read.
local function batch_info(b, besides)
  local BK = P .. 'batch:' .. b
  local h = redis.call('HMGET', BK, 'max_total_cost', 'max_running', 'spent', 'created_at')
  if not h[4] then return nil end
  local RK = P .. 'batchrun:' .. b
  local n = 0
  for _, j in ipairs(redis.call('SMEMBERS', RK)) do
    if redis.call('HGET', P .. 'job:' .. j, 'status') == 'running' then
      if j ~= besides then n = n + 1 end
    else redis.call('SREM', RK, j) end
  end
  return {h[1] or false, h[2] or false, h[3] or '0', n}
end
local function batch_ttl(b)
  local ttl = math.max(1, math.floor(RET)) + 86400
  for _, k in ipairs({P .. 'batch:' .. b, P .. 'batchjobs:' .. b, P .. 'batchrun:' .. b}) do
    redis.call('EXPIRE', k, ttl)
  end
end
-- A job has just ended: its API key goes, its data expires (unless pinned), its artifacts' blobs live as long at least.
local function ended(t)
  redis.call('ZADD', P .. 'ended', t, ID)
  redis.call('DEL', P .. 'secret:' .. ID)
  if field('pinned') == '1' then return end
  local ttl = math.max(1, math.floor(RET))
  for _, k in ipairs({K, P .. 'inbox:' .. ID, P .. 'events:' .. ID, P .. 'evseq:' .. ID, P .. 'artifacts:' .. ID}) do
    redis.call('EXPIRE', k, ttl)
  end
  local digests = redis.call('HVALS', P .. 'artifacts:' .. ID)
  for _, d in ipairs(digests) do redis.call('EXPIRE', P .. 'blob:' .. string.sub(d, 8), ttl, 'GT') end
end
