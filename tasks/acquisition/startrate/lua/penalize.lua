-- penalize: provider pushback. Cut every rule's adaptive rate once per epoch
-- (multiplicative decrease, not below the floor) and grant nothing for the cooldown.
--
-- KEYS[i]  rule i's hash (see prelude.lua); every key in one hash slot
-- ARGV[1]  now_us: "" in production (Redis TIME); an integer only in tests
-- ARGV[2]  idle_ttl_ms
-- ARGV[3]  permit_epoch: the epoch of the permit whose start was pushed back
-- ARGV[4]  cooldown_us
-- ARGV[5i .. 5i+4]  rule i: initial, max, floor (mpm), decrease (ppm), fixed (mpm, 0 =
--          none); an override's adaptive rate is still cut, for later
-- Returns  {applied 0|1, rate_mpm, epoch, cooldown_until_ms, server_now_ms}
--          applied = 0 when permit_epoch is older than the bucket's epoch: that pushback
--          was already counted, so nothing changes.
-- Calls    one HMGET per rule; when applied, one HSET (r, e, c, x) and one PEXPIRE per rule.

local now = clock(ARGV[1])
local n = #KEYS
local permit_epoch = tonumber(ARGV[3])
local R, T, C = {}, {}, {}
local epoch, cooldown, slowest = 0, 0, nil
for i = 1, n do
  local a = 5 * i
  local r, t, e, c = state(KEYS[i])
  r = math.min(tonumber(ARGV[a + 1]), math.max(tonumber(ARGV[a + 2]), r or tonumber(ARGV[a])))
  R[i], T[i], C[i] = r, t, c
  if e > epoch then epoch = e end
  if c > cooldown then cooldown = c end
  local eff = tonumber(ARGV[a + 4])
  if eff == 0 then eff = r end
  if slowest == nil or eff < slowest then slowest = eff end
end

local now_ms = math.floor(now / 1000)
if permit_epoch < epoch then
  return {0, slowest, epoch, math.ceil(cooldown / 1000), now_ms}
end

-- max(): a permit from before a key was lost still moves the epoch past itself.
local new_epoch = math.max(epoch, permit_epoch) + 1
local until_us = now + math.max(0, tonumber(ARGV[4]))
local idle_ttl = tonumber(ARGV[2])
slowest, cooldown = nil, 0
for i = 1, n do
  local a = 5 * i
  -- rate * ppm stays below 2^53 (rates are capped at 1e9 mpm), so floor() is exact.
  local r = math.max(tonumber(ARGV[a + 2]), math.floor(R[i] * tonumber(ARGV[a + 3]) / 1000000))
  local c = math.max(C[i], until_us)
  local want = expiry(idle_ttl, now, math.max(T[i], c))
  -- t too: a new key gets every field, so scripts of the previous release can read it.
  redis.call('HSET', KEYS[i], 'r', int(r), 't', int(T[i]), 'e', int(new_epoch), 'c', int(c),
    'x', int(want))
  redis.call('PEXPIRE', KEYS[i], want - now_ms)
  local eff = tonumber(ARGV[a + 4])
  if eff == 0 then eff = r end
  if slowest == nil or eff < slowest then slowest = eff end
  if c > cooldown then cooldown = c end
end
return {1, slowest, new_epoch, math.ceil(cooldown / 1000), now_ms}
