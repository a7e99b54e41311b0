-- pin_job.lua: Keeps a job past the retention period: its keys and its artifacts' blobs lose their TTLs and it is marked
-- pinned (so its end sets none). Atomic: an artifact added or a job ending meanwhile sees the mark.
if redis.call('EXISTS', K) == 0 then return 0 end
redis.call('HSET', K, 'pinned', 1)
for _, k in ipairs({K, P .. 'inbox:' .. ID, P .. 'events:' .. ID, P .. 'evseq:' .. ID, P .. 'artifacts:' .. ID}) do
  redis.call('PERSIST', k)
end
for _, d in ipairs(redis.call('HVALS', P .. 'artifacts:' .. ID)) do
  redis.call('PERSIST', P .. 'blob:' .. string.sub(d, 8))
end
return 1
