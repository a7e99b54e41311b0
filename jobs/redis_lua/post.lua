-- post.lua: Queues a steering or follow-up message for a queued or running job. Atomic: a message is never left in the
-- inbox of a job that has ended.
if not active(field('status')) then return 0 end
redis.call('RPUSH', P .. 'inbox:' .. ID, cjson.encode({A.kind, A.text}))
return 1
