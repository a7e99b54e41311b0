-- take_messages.lua: A job's undelivered messages, taken (deleted) as they are read. Atomic: a message posted meanwhile is
-- either in this answer or left for the next, never lost between the read and the delete.
local key = P .. 'inbox:' .. ID
local messages = redis.call('LRANGE', key, 0, -1)
redis.call('DEL', key)
return messages
