-- mark_undispatched.lua: A publish failed: a queued job's dispatch record is dropped and the error kept, so the job is
-- dispatched again. Atomic: a job that was claimed meanwhile is left as it is.
if field('status') ~= 'queued' then return 0 end
redis.call('HDEL', K, 'dispatched_at')
redis.call('HSET', K, 'dispatch_error', A.error)
if field('undispatched_since') == nil then redis.call('HSET', K, 'undispatched_since', fmt(now())) end
return 1
