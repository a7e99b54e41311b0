-- touch_blob.lua: Renews a stored blob's TTL (never shortens it). Returns 0 when there is none. Atomic: the check and the
-- renewal are one step, so a blob found is not dropped before it is renewed.
local key = P .. 'blob:' .. A.hex
if redis.call('EXISTS', key) == 0 then return 0 end
redis.call('EXPIRE', key, math.max(1, math.floor(RET)), 'GT')
return 1
