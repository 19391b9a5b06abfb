-- penalize: provider pushback. Cut every rule's adaptive rate once per epoch
-- (multiplicative decrease, not below the floor) and grant nothing for the cooldown.
--
-- KEYS[i]  one hash per rule, all in one hash slot: playrun:startrate:{<bucket>}:rule:<name>
--          (fields as in acquire.lua: r rate mpm, t TAT us, e epoch, c cooldown end us)
-- ARGV[1]  now_us override: "" in production (Redis TIME); an integer only in tests
-- ARGV[2]  idle_ttl_ms: keys expire this long after their last state (tat/cooldown)
-- ARGV[3]  permit_epoch: the epoch of the permit whose start was pushed back
-- ARGV[4]  cooldown_us
-- ARGV[5+6*(i-1) ..]  rule i: initial, max, floor, increase (mpm), decrease (ppm),
--          fixed (mpm, 0 = none); an override's adaptive rate is still cut, for later
-- Reply    {applied 0|1, rate_mpm, epoch, cooldown_until_ms, server_now_ms}
--          applied = 0 when permit_epoch is older than the bucket's epoch: that pushback
--          was already counted, so nothing changes.
--
-- Integers only (below 2^53, integer replies). Mirrors maths.penalize.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local idle_ttl = tonumber(ARGV[2])
local permit_epoch = tonumber(ARGV[3])
local cooldown_us = math.max(0, tonumber(ARGV[4]))
local n = #KEYS

local P, S = {}, {}
local epoch, cooldown = 0, 0
for i = 1, n do
  local b = 4 + 6 * (i - 1)
  local p = {
    initial = tonumber(ARGV[b + 1]), max = tonumber(ARGV[b + 2]),
    floor = tonumber(ARGV[b + 3]), dec = tonumber(ARGV[b + 5]),
    fixed = tonumber(ARGV[b + 6]),
  }
  local h = redis.call('HMGET', KEYS[i], 'r', 't', 'e', 'c')
  local s
  if h[1] then
    s = {r = tonumber(h[1]), t = tonumber(h[2]), e = tonumber(h[3]), c = tonumber(h[4])}
  else
    s = {r = p.initial, t = 0, e = 0, c = 0}
  end
  s.adaptive = math.min(p.max, math.max(p.floor, s.r))
  P[i], S[i] = p, s
  if s.e > epoch then epoch = s.e end
  if s.c > cooldown then cooldown = s.c end
end

local function effective(p, r)
  if p.fixed > 0 then return p.fixed end
  return r
end

local now_ms = math.floor(now / 1000)
if permit_epoch < epoch then
  local rate = effective(P[1], S[1].adaptive)
  for i = 2, n do rate = math.min(rate, effective(P[i], S[i].adaptive)) end
  return {0, rate, epoch, math.ceil(cooldown / 1000), now_ms}
end

-- max(): a permit from before a key was lost still moves the epoch past itself.
local new_epoch = math.max(epoch, permit_epoch) + 1
local until_us = now + cooldown_us
local rate = nil
cooldown = 0
for i = 1, n do
  local p, s = P[i], S[i]
  -- rate * ppm stays below 2^53 (rates are capped at 1e9 mpm), so floor() is exact.
  local r = math.max(p.floor, math.floor(s.adaptive * p.dec / 1000000))
  local c = math.max(s.c, until_us)
  redis.call('HSET', KEYS[i], 'r', string.format('%d', r), 't', string.format('%d', s.t),
    'e', string.format('%d', new_epoch), 'c', string.format('%d', c))
  local last = math.max(s.t, c)
  redis.call('PEXPIRE', KEYS[i], idle_ttl + math.ceil(math.max(0, last - now) / 1000))
  local eff = effective(p, r)
  if rate == nil or eff < rate then rate = eff end
  if c > cooldown then cooldown = c end
end
return {1, rate, new_epoch, math.ceil(cooldown / 1000), now_ms}
