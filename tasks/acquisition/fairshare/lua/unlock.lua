-- unlock: end the relay's lease if it is still ours (another may hold it since).
--
-- KEYS[1]  the lease key
-- ARGV[1]  our token
-- Returns  1 if released, else 0

if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
