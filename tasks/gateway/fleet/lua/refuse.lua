-- refuse: count one refused request of an attempt against its hard budget, a leaky count
-- (refusals.py): each refusal adds window_ms units, it drains `limit` units per ms, past
-- limit * window_ms the attempt is failed: once, for whichever caller crossed it.
--
-- KEYS[1]  the attempt's abuse key (see prelude.lua)
-- ARGV[1]  packed: limit, window_ms, failed_min_us, idle_ms (maths.Params)
-- ARGV[2]  the refusal's code; ARGV[3] keep_us (how long its token is still valid)
-- ARGV[4]  now_us, tests only; empty in production (Redis TIME)
-- Returns  {0} counted; {1, code, count, ...} this refusal failed the attempt, with its
--          refusals by code; {2} the attempt was failed already (nothing counted)

local A = numbers(ARGV[1], 4)
local now = clock(ARGV[4])
local h = redis.call('HMGET', KEYS[1], 'l', 'u', 'x')
if (tonumber(h[3]) or 0) > now then return {2} end

local limit, window = A[1], A[2]
local now_ms = floor(now / 1000)
local level = tonumber(h[1]) or 0
local elapsed = max(now_ms - (tonumber(h[2]) or now_ms), 0)
if elapsed >= ceil(level / limit) then level = 0 else level = level - elapsed * limit end
level = level + window
redis.call('HINCRBY', KEYS[1], 'c:' .. ARGV[2], 1)
-- The count outlives the time it takes to drain: a key gone is a count of zero.
local ttl = A[4] + ceil(level / limit)
if level <= limit * window then
  redis.call('HSET', KEYS[1], 'l', int(level), 'u', int(now_ms))
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {0}
end

local x = now + max(tonumber(ARGV[3]), A[3])
redis.call('HSET', KEYS[1], 'l', int(level), 'u', int(now_ms), 'x', int(x))
redis.call('PEXPIRE', KEYS[1], max(ttl, ceil((x - now) / 1000) + A[4]))
local out, all = {1}, redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'c:' then
    out[#out + 1] = string.sub(all[i], 3)
    out[#out + 1] = tonumber(all[i + 1])
  end
end
return out
