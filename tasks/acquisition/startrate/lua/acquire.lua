-- acquire: one start permit from every rule of a bucket (GCRA pacing, AIMD increase).
--
-- KEYS[i]  rule i's hash (see prelude.lua); every key in one hash slot
-- ARGV[1]  packed integers (see prelude.lua): horizon_us (a grant may be scheduled at
--          most this far ahead), idle_ttl_ms, observed_successes (additive-increase
--          steps this grant earns), then per rule i at A[5i-1 .. 5i+3]: initial, max,
--          floor, increase (mpm), fixed (mpm, 0 = none)
-- ARGV[2]  now_us, tests only; absent in production (Redis TIME)
-- Returns  a status reply "granted scheduled_at_ms server_now_ms wait_ms rate_mpm epoch"
--          (six integers: one line is cheaper to build and to parse than six replies);
--          granted 0|1, rate the slowest rule's effective rate after the decision,
--          wait_ms 0 on a grant.
-- Calls    one HMGET per rule; a grant adds one HSET per rule (t, and r only when it
--          changed), and a PEXPIRE only when the key's TTL fell a tenth of idle_ttl
--          short; a denial writes nothing.

local n = #KEYS
local A = numbers(ARGV[1], 3 + 5 * n)
local now = clock(ARGV[2])
-- Per rule: its state table h, with h[6] the clamped rate and h[7] the effective rate.
local S = {}
local scheduled, cooldown, epoch, slowest = now, 0, 0, nil
for i = 1, n do
  local a = 5 * i - 2
  local h = state(KEYS[i])
  local r = min(A[a + 2], max(A[a + 3], h[1] or A[a + 1]))  -- clamped (prelude)
  local eff = A[a + 5]
  if eff == 0 then eff = r end
  h[6], h[7] = r, eff
  S[i] = h
  if h[2] > scheduled then scheduled = h[2] end
  if h[4] > cooldown then cooldown = h[4] end
  if h[3] > epoch then epoch = h[3] end
  if slowest == nil or eff < slowest then slowest = eff end
end

local now_ms = floor(now / 1000)
local need = max(cooldown - now, scheduled - now - A[1])
if need > 0 then
  -- Denied: reserve nothing. wait_ms counts from the reported ms so that an acquire at
  -- server_now_ms + wait_ms is past both the cooldown and the horizon.
  return {ok = fmt('0 %d %d %d %d %d', ceil(max(scheduled, cooldown) / 1000), now_ms,
                   ceil((now + need) / 1000) - now_ms, slowest, epoch)}
end

local idle_ttl, successes = A[2], A[3]
slowest = nil
for i = 1, n do
  local a, h = 5 * i - 2, S[i]
  local r, eff = h[6], h[7]
  -- Every rule's next slot follows the shared schedule, so each rule stays paced.
  local tat = scheduled + ceil(60000000000 / eff)
  -- Additive increase only while busy (a backlog, or the slot came at most an interval
  -- ago: a deferred start arrives after it) and never under an override.
  if A[a + 5] == 0 then
    if h[2] + ceil(60000000000 / h[7]) >= now and successes > 0 then
      r = min(A[a + 2], r + A[a + 4] * successes)
    end
    eff = r
  end
  local want = expiry(idle_ttl, now, max(tat, h[4]))
  if h[1] == nil then
    -- A new key gets every field, so scripts of the previous release can read it.
    redis.call('HSET', KEYS[i], 'r', int(r), 't', int(tat), 'e', '0', 'c', '0', 'x', int(want))
    redis.call('PEXPIRE', KEYS[i], want - now_ms)
  elseif want - (tonumber(h[5]) or 0) > idle_ttl / 10 then  -- see expiry()
    redis.call('HSET', KEYS[i], 'r', int(r), 't', int(tat), 'x', int(want))
    redis.call('PEXPIRE', KEYS[i], want - now_ms)
  elseif r ~= h[1] then
    redis.call('HSET', KEYS[i], 'r', int(r), 't', int(tat))
  else
    redis.call('HSET', KEYS[i], 't', int(tat))  -- r as stored: an override, or no growth
  end
  if slowest == nil or eff < slowest then slowest = eff end
end
return {ok = fmt('1 %d %d 0 %d %d', ceil(scheduled / 1000), now_ms, slowest, epoch)}
