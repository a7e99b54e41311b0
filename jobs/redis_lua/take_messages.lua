-- take_messages.lua: A job's messages not yet taken, in the order they were posted. They stay in the inbox, counted as
-- taken (inbox_taken): a new attempt starts the conversation again and takes them all again (claim.lua). Atomic: a
-- message posted meanwhile is either in this answer or left for the next, never lost between the read and the count.
if redis.call('EXISTS', K) == 0 then return {} end
local taken = tonumber(field('inbox_taken')) or 0
local messages = redis.call('LRANGE', P .. 'inbox:' .. ID, taken, -1)
if #messages > 0 then redis.call('HSET', K, 'inbox_taken', taken + #messages) end
return messages
