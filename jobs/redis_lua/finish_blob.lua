-- finish_blob.lua: blob:{hex} appears whole, by one RENAME of its finished upload, or not at all; a second upload of a
-- blob stored already is dropped and the stored one's TTL renewed (a pinned blob gets none). Atomic: no reader ever
-- sees part of a blob, and of two uploads of one blob one is kept.
local tmp, final = P .. 'upload:' .. A.upload, P .. 'blob:' .. A.hex
local ttl = math.max(1, math.floor(RET))
if redis.call('EXISTS', final) == 1 then
  redis.call('DEL', tmp)
  redis.call('EXPIRE', final, ttl, 'GT')
  return 0
end
if redis.call('EXISTS', tmp) == 0 then return redis.error_reply('upload ' .. A.upload .. ' expired') end
redis.call('RENAME', tmp, final)
if redis.call('SISMEMBER', P .. 'pins', A.hex) == 1 then redis.call('PERSIST', final)
else redis.call('EXPIRE', final, ttl) end
return 1
