-- add_batch_spend.lua: Adds a model call's cost to its batch (ID: the batch's id) and returns the batch now (nil: no such
-- batch). Atomic: two workers adding at once never lose one addition.
local BK = P .. 'batch:' .. ID
if redis.call('EXISTS', BK) == 0 then return false end
redis.call('HINCRBYFLOAT', BK, 'spent', A.amount)
batch_ttl(ID)
return batch_info(ID, nil)
