-- set_batch.lua: Creates a batch, or sets its limits anew (a rerun may change them); what it spent is kept. ID is the
-- batch's id here. Returns the batch as batch_info() sees it. Atomic: a concurrent claim sees the old limits or the
-- new, never half of them.
local BK = P .. 'batch:' .. ID
if redis.call('EXISTS', BK) == 0 then redis.call('HSET', BK, 'spent', '0', 'created_at', fmt(now())) end
set_or_del_in(BK, 'max_total_cost', A.max_total_cost)
set_or_del_in(BK, 'max_running', A.max_running)
batch_ttl(ID)
return batch_info(ID, nil)
