-- admit: one request of an attempt, of `size` bytes, or how long it must wait.
--
-- KEYS[1..3]  the attempt's bucket, abuse and flight keys (see prelude.lua)
-- ARGV[1]     packed: request_rate, request_burst, byte_rate, byte_burst, byte_cap,
--             max_in_flight, hold_us, idle_ms (maths.Params)
-- ARGV[2]     size (bytes the request declares); ARGV[3] its request id
-- ARGV[4]     now_us, tests only; empty in production (Redis TIME)
-- Returns     {answer, wait_us}: 0 admitted (the id is held in flight), 1 too many in
--             flight, 2 past a bucket (wait_us until both hold enough), 3 the attempt
--             was failed GATEWAY_ABUSE. Only an admission writes.

local A = numbers(ARGV[1], 8)
local now = clock(ARGV[4])
if (tonumber(redis.call('HGET', KEYS[2], 'x')) or 0) > now then return {3, 0} end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)  -- holds of processes that died
if redis.call('ZCARD', KEYS[3]) >= A[6] then return {1, 100000} end

local h = redis.call('HMGET', KEYS[1], 'r', 'b', 't')
local r, b, t = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])
local elapsed = max(now - (t or now), 0)
-- Refilled from the elapsed time, never past the burst (a missing key is full).
if r == nil or elapsed >= ceil((A[2] - r) / A[1]) then r = A[2] else r = r + elapsed * A[1] end
if b == nil or elapsed >= ceil((A[4] - b) / A[3]) then b = A[4] else b = b + elapsed * A[3] end
local size = min(max(tonumber(ARGV[2]) or 0, 0), A[5])
local wait = max(ceil((1000000000 - r) / A[1]), ceil((size * 1000000 - b) / A[3]), 0)
if wait > 0 then return {2, wait} end

r, b = r - 1000000000, b - size * 1000000
redis.call('HSET', KEYS[1], 'r', int(r), 'b', int(b), 't', int(now))
-- The bucket outlives the time it takes to fill again: a key gone is a full bucket.
local full = max(ceil((A[2] - r) / A[1]), ceil((A[4] - b) / A[3]))
redis.call('PEXPIRE', KEYS[1], A[8] + ceil(full / 1000))
redis.call('ZADD', KEYS[3], now + A[7], ARGV[3])
redis.call('PEXPIRE', KEYS[3], A[8] + ceil(A[7] / 1000))
return {0, 0}
