-- worker_stopped.lua: A worker stopped cleanly (ID: its node name): marked stopped, running 0, no warm pool; its
-- heartbeat stays until forget_silent_workers. Atomic: a stop is one write, seen whole.
local key = P .. 'worker:' .. ID
if redis.call('EXISTS', key) == 0 then return 0 end
redis.call('HSET', key, 'stopped_at', fmt(now()), 'running', 0)
redis.call('HDEL', key, 'free_since', 'pool')   -- (its warm pool was removed as it stopped)
return 1
