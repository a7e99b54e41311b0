-- mark_published.lua: The publish went through: the job's dispatch error and undispatched_since are dropped. One write;
-- a script so it runs once (once.lua) like every other write.
redis.call('HDEL', K, 'dispatch_error', 'undispatched_since')
return 1
