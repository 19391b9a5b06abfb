-- acquire: one start permit from every rule of a bucket (GCRA pacing, AIMD increase).
--
-- KEYS[i]  one hash per rule, all in one hash slot: playrun:startrate:{<bucket>}:rule:<name>
--          fields r = adaptive rate (milli-starts/min), t = TAT (us), e = epoch,
--          c = cooldown end (us). A missing key starts at the initial rate, epoch 0.
-- ARGV[1]  now_us override: "" in production (Redis TIME is the clock); tests pass an
--          integer so the differential test can replay exact arrival times.
-- ARGV[2]  horizon_us: a grant may be scheduled at most this far in the future
-- ARGV[3]  idle_ttl_ms: keys expire this long after their last state (tat/cooldown)
-- ARGV[4]  observed_successes: additive-increase steps this grant earns
-- ARGV[5+6*(i-1) ..]  rule i: initial, max, floor, increase (mpm), decrease (ppm),
--          fixed (mpm, 0 = no operator override)
-- Reply    {granted 0|1, scheduled_at_ms, server_now_ms, wait_ms, rate_mpm, epoch}
--          rate is the slowest rule's after the decision; wait_ms is 0 on a grant.
--
-- Integers only: every value stays below 2^53, where doubles are exact, and replies
-- are integers because Redis truncates Lua floats. Mirrors maths.acquire.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local horizon = tonumber(ARGV[2])
local idle_ttl = tonumber(ARGV[3])
local successes = tonumber(ARGV[4])
local n = #KEYS

local function interval(rate) return math.ceil(60000000000 / rate) end

local P, S = {}, {}
local scheduled, cooldown, epoch = now, 0, 0
for i = 1, n do
  local b = 4 + 6 * (i - 1)
  local p = {
    initial = tonumber(ARGV[b + 1]), max = tonumber(ARGV[b + 2]),
    floor = tonumber(ARGV[b + 3]), inc = tonumber(ARGV[b + 4]),
    fixed = tonumber(ARGV[b + 6]),
  }
  local h = redis.call('HMGET', KEYS[i], 'r', 't', 'e', 'c')
  local s
  if h[1] then
    s = {r = tonumber(h[1]), t = tonumber(h[2]), e = tonumber(h[3]), c = tonumber(h[4])}
  else
    s = {r = p.initial, t = 0, e = 0, c = 0}
  end
  -- Clamped on read so a changed floor/max applies at once to stored state.
  s.adaptive = math.min(p.max, math.max(p.floor, s.r))
  if p.fixed > 0 then s.eff = p.fixed else s.eff = s.adaptive end
  P[i], S[i] = p, s
  if s.t > scheduled then scheduled = s.t end
  if s.c > cooldown then cooldown = s.c end
  if s.e > epoch then epoch = s.e end
end

local now_ms = math.floor(now / 1000)
local need = math.max(cooldown - now, scheduled - now - horizon)
if need > 0 then
  -- Denied: reserve nothing. wait_ms counts from the reported ms so that an acquire
  -- at server_now_ms + wait_ms is past both the cooldown and the horizon.
  local rate = S[1].eff
  for i = 2, n do rate = math.min(rate, S[i].eff) end
  local wait_ms = math.ceil((now + need) / 1000) - now_ms
  local earliest = math.ceil(math.max(scheduled, cooldown) / 1000)
  return {0, earliest, now_ms, wait_ms, rate, epoch}
end

local rate = nil
for i = 1, n do
  local p, s = P[i], S[i]
  local tat = scheduled + interval(s.eff)
  local r = s.adaptive
  -- Additive increase only while busy (a backlog, or a permit within the last
  -- interval) and never under an override, whose adaptive state is kept as it was.
  if p.fixed == 0 and s.t >= now and successes > 0 then
    r = math.min(p.max, r + p.inc * successes)
  end
  redis.call('HSET', KEYS[i], 'r', string.format('%d', r), 't', string.format('%d', tat),
    'e', string.format('%d', s.e), 'c', string.format('%d', s.c))
  local last = math.max(tat, s.c)
  redis.call('PEXPIRE', KEYS[i], idle_ttl + math.ceil(math.max(0, last - now) / 1000))
  local eff = r
  if p.fixed > 0 then eff = p.fixed end
  if rate == nil or eff < rate then rate = eff end
end
return {1, math.ceil(scheduled / 1000), now_ms, 0, rate, epoch}
