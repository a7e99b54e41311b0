-- put_artifact.lua: Records a job's artifact (name -> blob digest) and makes its blob live as long as the job (or for good
-- when the job is pinned). Returns 0 for an unknown job. Atomic: a job pinned or ending meanwhile cannot leave the
-- blob with a shorter life than the job's.
if redis.call('EXISTS', K) == 0 then return 0 end
local key = P .. 'artifacts:' .. ID
redis.call('HSET', key, A.name, A.digest)
local blob = P .. 'blob:' .. string.sub(A.digest, 8)
if field('pinned') == '1' then redis.call('PERSIST', blob) else
  local ttl = redis.call('TTL', K)
  if ttl > 0 then
    redis.call('EXPIRE', key, ttl)
    redis.call('EXPIRE', blob, ttl, 'GT')
  end
end
return 1
