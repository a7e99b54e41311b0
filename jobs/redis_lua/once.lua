-- once.lua: Wraps every script that writes (all but the read-only ones): pid sends a script again when the connection
-- breaks before its reply, and a job's write is tried again through a store outage (jobs/outage.py), so a script that
-- ran but whose reply was lost would run twice (a claim refused to its own claimer, messages taken twice, i.e. lost).
-- Each call carries a token (ARGV[5]); its result is kept under done:{token} for ARGV[6] seconds (ten minutes, or as
-- long as the write may be tried again) and a second run with that token returns it without doing anything. Atomic with the script it wraps: the check, the work and the record of its result are one script.
-- The line "-- {script}" below is replaced by the script's body.
local DONE = P .. 'done:' .. ARGV[5]
local prior = redis.call('GET', DONE)
if prior then return cjson.decode(prior)[1] end
local result = (function()
-- {script}
end)()
redis.call('SET', DONE, cjson.encode({result}), 'EX', tonumber(ARGV[6]) or 600)
return result
