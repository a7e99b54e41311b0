-- set_paused.lua: Pauses or resumes a queued or running job. Atomic: an ended job is never marked.
if not active(field('status')) then return 0 end
redis.call('HSET', K, 'paused', A.paused)
return 1
