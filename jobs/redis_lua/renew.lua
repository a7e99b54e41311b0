-- renew.lua: The lease holder extends its lease. Atomic: the check of owner and status and the write are one step, so a
-- worker whose lease lapsed and whose job another took can never renew it.
if field('status') ~= 'running' or field('owner') ~= A.owner then return 0 end
redis.call('HSET', K, 'lease_until', fmt(now() + A.lease_s))
return 1
