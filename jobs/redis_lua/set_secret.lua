-- set_secret.lua: Keeps a job's API key while the job is queued or running. Atomic: a job ending meanwhile (whose end
-- deletes the key) never gets it back.
if not active(field('status')) then return 0 end
redis.call('SET', P .. 'secret:' .. ID, A.api_key)
return 1
