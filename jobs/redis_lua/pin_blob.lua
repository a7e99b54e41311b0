-- pin_blob.lua: Keeps a blob past the retention period: remembered in pins (an upload finishing later keeps it too) and its
-- TTL removed. Returns 0 when there is none. Atomic: pin and TTL change together.
local key = P .. 'blob:' .. A.hex
if redis.call('EXISTS', key) == 0 then return 0 end
redis.call('SADD', P .. 'pins', A.hex)
redis.call('PERSIST', key)
return 1
