-- prelude: shared by acquire, penalize and inspect. bucket.py puts it in front of each
-- script when it loads it, so the three read the clock and a rule's state alike.
--
-- A rule's state is one hash, playrun:startrate:{<bucket>}:rule:<name>, with fields
--   r  adaptive rate, milli-starts per minute (mpm)
--   t  GCRA theoretical arrival time (TAT), us
--   e  penalty epoch
--   c  cooldown end, us
--   x  when the key expires (ms, Redis clock), as the last PEXPIRE set it
-- A missing key is a fresh rule (initial rate, epoch 0); a missing field reads as 0.
-- Integers only: every value stays below 2^53, where doubles are exact, and replies are
-- integers because Redis truncates Lua floats. The maths mirror startrate/maths.py.

-- now in us: ARGV now_us when given (tests replay exact arrivals), else Redis TIME,
-- the one clock every worker shares.
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- r (nil for a missing key), t, e, c, x of one rule: one HMGET.
local function state(key)
  local h = redis.call('HMGET', key, 'r', 't', 'e', 'c', 'x')
  return tonumber(h[1]), tonumber(h[2]) or 0, tonumber(h[3]) or 0, tonumber(h[4]) or 0,
    tonumber(h[5]) or 0
end

-- The expiry a key needs (ms): idle_ttl_ms past the last instant its state matters (TAT
-- or cooldown). A key whose expiry x is at most a tenth of idle_ttl short of it keeps
-- its TTL (no PEXPIRE): it still outlives that instant by 0.9 idle_ttl, long after its
-- state stopped mattering, so an early expiry can only restart an idle rule.
local function expiry(idle_ttl, now, last)
  return math.floor(now / 1000) + idle_ttl + math.ceil(math.max(0, last - now) / 1000)
end

local function stale(x, want, idle_ttl)
  return want - x > idle_ttl / 10
end

local function int(v) return string.format('%d', v) end

