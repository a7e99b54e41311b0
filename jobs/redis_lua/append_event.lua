-- append_event.lua: Adds an event to a job's stream under the next number (returned), keeping about the newest A.kept, with
-- the job's TTL. An unknown job is an error. Atomic: numbers are never given twice or out of order.
if redis.call('EXISTS', K) == 0 then return redis.error_reply('no job ' .. ID) end
local n = redis.call('INCR', P .. 'evseq:' .. ID)
local key = P .. 'events:' .. ID
redis.call('XADD', key, 'MAXLEN', '~', A.kept, n .. '-0', 'e', A.event)
local ttl = redis.call('TTL', K)
if ttl > 0 then
  redis.call('EXPIRE', key, ttl)
  redis.call('EXPIRE', P .. 'evseq:' .. ID, ttl)
end
return n
