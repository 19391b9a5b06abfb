-- acquire: one start permit from every rule of a bucket (GCRA pacing, AIMD increase).
--
-- KEYS[i]  rule i's hash (see prelude.lua); every key in one hash slot
-- ARGV[1]  now_us: "" in production (Redis TIME); an integer only in tests
-- ARGV[2]  horizon_us: a grant may be scheduled at most this far ahead
-- ARGV[3]  idle_ttl_ms
-- ARGV[4]  observed_successes: additive-increase steps this grant earns
-- ARGV[5i .. 5i+4]  rule i: initial, max, floor, increase (mpm), fixed (mpm, 0 = none)
-- Returns  {granted 0|1, scheduled_at_ms, server_now_ms, wait_ms, rate_mpm, epoch}
--          rate: the slowest rule's effective rate after the decision; wait_ms 0 on a grant.
-- Calls    one HMGET per rule; a grant adds one HSET (r, t) per rule, and a PEXPIRE
--          only when the key's TTL fell a tenth of idle_ttl short; a denial writes nothing.

local now = clock(ARGV[1])
local n = #KEYS
-- Per rule: rate, TAT, cooldown, expiry, effective rate, and whether the key was missing.
local R, T, C, X, F, M = {}, {}, {}, {}, {}, {}
local scheduled, cooldown, epoch, slowest = now, 0, 0, nil
for i = 1, n do
  local a = 5 * i
  local r, t, e, c, x = state(KEYS[i])
  M[i] = r == nil
  -- Clamped on read so a changed floor/max applies at once to stored state.
  r = math.min(tonumber(ARGV[a + 1]), math.max(tonumber(ARGV[a + 2]), r or tonumber(ARGV[a])))
  local eff = tonumber(ARGV[a + 4])
  if eff == 0 then eff = r end
  R[i], T[i], C[i], X[i], F[i] = r, t, c, x, eff
  if t > scheduled then scheduled = t end
  if c > cooldown then cooldown = c end
  if e > epoch then epoch = e end
  if slowest == nil or eff < slowest then slowest = eff end
end

local now_ms = math.floor(now / 1000)
local need = math.max(cooldown - now, scheduled - now - tonumber(ARGV[2]))
if need > 0 then
  -- Denied: reserve nothing. wait_ms counts from the reported ms so that an acquire at
  -- server_now_ms + wait_ms is past both the cooldown and the horizon.
  return {0, math.ceil(math.max(scheduled, cooldown) / 1000), now_ms,
          math.ceil((now + need) / 1000) - now_ms, slowest, epoch}
end

local idle_ttl, successes = tonumber(ARGV[3]), tonumber(ARGV[4])
slowest = nil
for i = 1, n do
  local a = 5 * i
  -- Every rule's next slot follows the shared schedule, so each rule stays paced.
  local tat = scheduled + math.ceil(60000000000 / F[i])
  local r, eff = R[i], F[i]
  -- Additive increase only while busy (a backlog, or a permit within the last interval)
  -- and never under an override, whose adaptive state is kept as it was.
  if tonumber(ARGV[a + 4]) == 0 then
    if T[i] >= now and successes > 0 then
      r = math.min(tonumber(ARGV[a + 1]), r + tonumber(ARGV[a + 3]) * successes)
    end
    eff = r
  end
  local want = expiry(idle_ttl, now, math.max(tat, C[i]))
  if M[i] then
    -- A new key gets every field, so scripts of the previous release can read it.
    redis.call('HSET', KEYS[i], 'r', int(r), 't', int(tat), 'e', '0', 'c', '0', 'x', int(want))
    redis.call('PEXPIRE', KEYS[i], want - now_ms)
  elseif stale(X[i], want, idle_ttl) then
    redis.call('HSET', KEYS[i], 'r', int(r), 't', int(tat), 'x', int(want))
    redis.call('PEXPIRE', KEYS[i], want - now_ms)
  else
    redis.call('HSET', KEYS[i], 'r', int(r), 't', int(tat))
  end
  if slowest == nil or eff < slowest then slowest = eff end
end
return {1, math.ceil(scheduled / 1000), now_ms, 0, slowest, epoch}
