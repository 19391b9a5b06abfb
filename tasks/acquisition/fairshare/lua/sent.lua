-- sent: count published start messages as in flight until their permit or their time.
--
-- KEYS[1..3]  G, O, C as in pick.lua
-- ARGV[1]     how long a message counts, ms
-- ARGV[2]     now_ms, or '' for Redis TIME
-- ARGV[3]     key TTL, ms
-- ARGV[2+2i .. 3+2i]  message i: task id, org
-- Returns     the number in flight.

local now
if ARGV[2] ~= '' then now = tonumber(ARGV[2]) else
  local t = redis.call('TIME'); now = t[1] * 1000 + math.floor(t[2] / 1000) end
local until_ms = now + tonumber(ARGV[1])
for i = 4, #ARGV, 2 do
  local id, org = ARGV[i], ARGV[i + 1]
  if redis.call('ZADD', KEYS[1], until_ms, id) == 1 then
    redis.call('HSET', KEYS[2], id, org)
    redis.call('HINCRBY', KEYS[3], org, 1)
  end
end
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], tonumber(ARGV[3])) end
return redis.call('ZCARD', KEYS[1])
