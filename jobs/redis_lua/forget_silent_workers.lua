-- forget_silent_workers.lua: Forgets workers not heard from for A.silent_s (killed, not stopped): their hash and their place
-- in the workers index go together. Atomic: a worker that beats meanwhile is kept.
local before = now() - A.silent_s
for _, node in ipairs(redis.call('ZRANGE', P .. 'workers', 0, -1)) do
  local key = P .. 'worker:' .. node
  local beat = tonumber(redis.call('HGET', key, 'beat_at') or '0')
  if beat < before then
    redis.call('DEL', key)
    redis.call('ZREM', P .. 'workers', node)
  end
end
return 1
