-- mark_undispatched.lua: A publish failed: a queued job's dispatch record is dropped and the error kept, so the job is
-- dispatched again; undispatched_since keeps when its publishes began to fail (a job its batch holds back, `parked`, is
-- not failing and has none). Atomic: a job that was claimed meanwhile is left as it is.
if field('status') ~= 'queued' then return 0 end
redis.call('HDEL', K, 'dispatched_at')
if A.parked then
  redis.call('HDEL', K, 'undispatched_since')
elseif field('dispatch_error') == nil or field('undispatched_since') == nil then
  redis.call('HSET', K, 'undispatched_since', fmt(now()))
end
redis.call('HSET', K, 'dispatch_error', A.error)
return 1
