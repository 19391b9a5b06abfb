-- taken: a start message is past its permit (or ended before it): it no longer counts.
--
-- KEYS[1..3]  G, O, C as in pick.lua; KEYS[4] H (for the last window)
-- ARGV[1]     the task id
-- Returns     {1 if it was counted else 0, in flight now, the last window, 0 if the last
--             pass left nothing unsent else 1}

local was = redis.call('ZREM', KEYS[1], ARGV[1])
if was == 1 then
  local org = redis.call('HGET', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  if org and redis.call('HINCRBY', KEYS[3], org, -1) <= 0 then
    redis.call('HDEL', KEYS[3], org)
  end
end
return {was, redis.call('ZCARD', KEYS[1]),
        tonumber(redis.call('HGET', KEYS[4], '~w')) or 0,
        tonumber(redis.call('HGET', KEYS[4], '~b')) or 1}
