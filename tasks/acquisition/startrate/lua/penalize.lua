-- penalize: provider pushback. Cut every rule's adaptive rate once per epoch
-- (multiplicative decrease, not below the floor) and grant nothing for the cooldown.
--
-- KEYS[i]  rule i's hash (see prelude.lua); every key in one hash slot
-- ARGV[1]  packed integers (see prelude.lua): idle_ttl_ms, permit_epoch (the epoch of
--          the permit whose start was pushed back), cooldown_us, then per rule i at
--          A[5i-1 .. 5i+3]: initial, max, floor (mpm), decrease (ppm), fixed (mpm, 0 =
--          none); an override's adaptive rate is still cut, for later
-- ARGV[2]  now_us, tests only; absent in production (Redis TIME)
-- Returns  {applied 0|1, rate_mpm, epoch, cooldown_until_ms, server_now_ms}
--          applied = 0 when permit_epoch is older than the bucket's epoch: that pushback
--          was already counted, so nothing changes.
-- Calls    one HMGET per rule; when applied, one HSET (r, e, c, x) and one PEXPIRE per rule.

local n = #KEYS
local A = numbers(ARGV[1], 3 + 5 * n)
local now = clock(ARGV[2])
local permit_epoch = A[2]
local R, T, C = {}, {}, {}
local epoch, cooldown, slowest = 0, 0, nil
for i = 1, n do
  local a = 5 * i - 2
  local h = state(KEYS[i])
  local r = min(A[a + 2], max(A[a + 3], h[1] or A[a + 1]))  -- clamped (prelude)
  R[i], T[i], C[i] = r, h[2], h[4]
  if h[3] > epoch then epoch = h[3] end
  if h[4] > cooldown then cooldown = h[4] end
  local eff = A[a + 5]
  if eff == 0 then eff = r end
  if slowest == nil or eff < slowest then slowest = eff end
end

local now_ms = floor(now / 1000)
if permit_epoch < epoch then
  return {0, slowest, epoch, ceil(cooldown / 1000), now_ms}
end

-- max(): a permit from before a key was lost still moves the epoch past itself.
local new_epoch = max(epoch, permit_epoch) + 1
local until_us = now + max(0, A[3])
local idle_ttl = A[1]
slowest, cooldown = nil, 0
for i = 1, n do
  local a = 5 * i - 2
  -- rate * ppm stays below 2^53 (rates are capped at 1e9 mpm), so floor() is exact.
  local r = max(A[a + 3], floor(R[i] * A[a + 4] / 1000000))
  local c = max(C[i], until_us)
  local want = expiry(idle_ttl, now, max(T[i], c))
  -- t too: a new key gets every field, so scripts of the previous release can read it.
  redis.call('HSET', KEYS[i], 'r', int(r), 't', int(T[i]), 'e', int(new_epoch), 'c', int(c),
    'x', int(want))
  redis.call('PEXPIRE', KEYS[i], want - now_ms)
  local eff = A[a + 5]
  if eff == 0 then eff = r end
  if slowest == nil or eff < slowest then slowest = eff end
  if c > cooldown then cooldown = c end
end
return {1, slowest, new_epoch, ceil(cooldown / 1000), now_ms}
